//! A connected pair of RC queue pairs and their buffers, for the tests and benches that
//! stream RDMA WRITEs from one to the other, on any provider.

use std::sync::Arc;

use selsig::{
    Access, Buffer, ConnectOptions, Device, MemoryRegion, QpCaps, QpInit, RemoteAddr, connect_pair,
};

/// QP `a` writes into `b`'s region: `a`'s sends complete on `cq`, the receives of both
/// (none are posted) and `b`'s sends on `recv`. Fields in drop order: the device first,
/// as its handles keep what they need.
pub struct WritePair<D: Device> {
    pub dev: D,
    /// `a`'s send CQ, of twice the depth, for a `SignaledQueue` to take whole.
    pub cq: Arc<D::Cq>,
    /// A send queue of the depth (`max_recv_wr` 1, `sq_sig_all` off).
    pub a: D::Qp,
    pub b: D::Qp,
    pub recv: D::Cq,
    /// As many buffers as the depth, each of the size, over one region of `a`'s.
    pub free: Vec<Buffer<D::Mr>>,
    /// `b`'s region, as large as `a`'s, that `target` names.
    pub remote: D::Mr,
    /// The start of `remote`: a buffer at offset `o` of its region writes to
    /// `target.offset(o)`.
    pub target: RemoteAddr,
}

/// Connects two QPs of `dev` and registers `depth` buffers of `size` bytes for them (see
/// [`WritePair`]).
///
/// # Panics
///
/// If the device refuses any of it.
pub fn write_pair<D: Device>(dev: D, depth: u32, size: usize) -> WritePair<D> {
    let pd = dev.alloc_pd().unwrap();
    let cq = Arc::new(dev.create_cq(2 * depth).unwrap());
    let recv = dev.create_cq(4).unwrap();
    let init = QpInit {
        caps: QpCaps {
            max_send_wr: depth,
            max_recv_wr: 1,
            ..QpCaps::default()
        },
        sq_sig_all: false,
    };
    let a = dev.create_qp(&pd, &cq, &recv, &init).unwrap();
    let b = dev.create_qp(&pd, &recv, &recv, &init).unwrap();
    connect_pair(&a, &b, &ConnectOptions::default()).unwrap();
    let n = depth as usize;
    let local = dev.reg_mr(&pd, n * size, Access::LOCAL_WRITE).unwrap();
    let remote = dev
        .reg_mr(&pd, n * size, Access::LOCAL_WRITE | Access::REMOTE_WRITE)
        .unwrap();
    let (free, _) = Buffer::new(local).split_into(n, size).ok().unwrap();
    let target = remote.remote(0);
    WritePair {
        dev,
        cq,
        a,
        b,
        recv,
        free,
        remote,
        target,
    }
}
