// A buffer split off the same region as a posted one cannot write the posted part: a
// buffer reaches only its own bytes, never its region.
use std::sync::Arc;

use selsig::{Access, Buffer, Device, MemoryRegion, Policy, QpCaps, QpInit, SignaledQueue, Work};
use selsig_soft::{SoftConfig, SoftDevice};

fn main() {
    let dev = SoftDevice::open(SoftConfig::default()).unwrap();
    let pd = dev.alloc_pd().unwrap();
    let cq = Arc::new(dev.create_cq(256).unwrap());
    let init = QpInit { caps: QpCaps::default(), sq_sig_all: false };
    let qp = dev.create_qp(&pd, &cq, &cq, &init).unwrap();
    let remote = dev.reg_mr(&pd, 64, Access::LOCAL_WRITE | Access::REMOTE_WRITE).unwrap();
    let whole = Buffer::new(dev.reg_mr(&pd, 128, Access::LOCAL_WRITE).unwrap());
    let (posted, sibling) = whole.split_at(64).unwrap();
    let mut queue: SignaledQueue<SoftDevice, ()> = SignaledQueue::new(qp, cq, Policy::Every(4)).unwrap();
    queue.post(Work::write(posted, remote.remote(0), ())).unwrap();
    sibling.region().write(0, &[0xff; 64]).unwrap();
}
