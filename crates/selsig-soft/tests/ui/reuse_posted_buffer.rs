// A buffer posted with an unsignaled WRITE cannot be written again before it is
// retired: posting moves it into the queue.
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
    let mut buf = Buffer::new(dev.reg_mr(&pd, 64, Access::LOCAL_WRITE).unwrap());
    let mut queue: SignaledQueue<SoftDevice, ()> = SignaledQueue::new(qp, cq, Policy::Every(4)).unwrap();
    queue.post(Work::write(buf, remote.remote(0), ())).unwrap();
    buf.fill(0xff).unwrap();
}
