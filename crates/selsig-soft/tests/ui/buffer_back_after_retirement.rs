// The buffer comes back when the work request is retired, and can then be reused.
use std::sync::Arc;

use selsig::{
    Access, Buffer, ConnectOptions, Device, MemoryRegion, Policy, QpCaps, QpInit, SignaledQueue,
    Work, connect_pair,
};
use selsig_soft::{SoftConfig, SoftDevice};

fn main() {
    let dev = SoftDevice::open(SoftConfig::default()).unwrap();
    let pd = dev.alloc_pd().unwrap();
    let cq = Arc::new(dev.create_cq(256).unwrap());
    let init = QpInit { caps: QpCaps::default(), sq_sig_all: false };
    let qp = dev.create_qp(&pd, &cq, &cq, &init).unwrap();
    let peer = dev.create_qp(&pd, &cq, &cq, &init).unwrap();
    connect_pair(&qp, &peer, &ConnectOptions::default()).unwrap();
    let remote = dev.reg_mr(&pd, 64, Access::LOCAL_WRITE | Access::REMOTE_WRITE).unwrap();
    let buf = Buffer::new(dev.reg_mr(&pd, 64, Access::LOCAL_WRITE).unwrap());
    let mut queue: SignaledQueue<SoftDevice, ()> = SignaledQueue::new(qp, cq, Policy::Every(4)).unwrap();
    queue.post(Work::write(buf, remote.remote(0), ())).unwrap();
    let mut done = Vec::new();
    queue.drain(std::time::Duration::from_secs(10), &mut done).unwrap();
    let mut buf = done.pop().unwrap().buffer.unwrap();
    buf.fill(0xff).unwrap();
}
