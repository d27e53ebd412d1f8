//! The idle cost of a waiting program: a queue on the software NIC with work outstanding
//! that will not complete soon (an unsignaled WRITE under `every:64`), its owner asleep in
//! `SignaledQueue::wait_with` for 5 s. The whole process (the NIC thread included) must
//! use under 1 % of a core: measured with `getrusage`, alone in this binary so that no
//! other test's threads count.

use std::sync::Arc;
use std::time::{Duration, Instant};

use selsig::{
    Access, Buffer, ConnectOptions, Device, MemoryRegion, Policy, QpCaps, QpInit, SignaledQueue,
    Work, connect_pair,
};
use selsig_soft::{SoftConfig, SoftDevice};

#[test]
fn a_queue_waiting_for_5_s_uses_under_1_percent_of_a_core() {
    let dev = SoftDevice::open(SoftConfig::default()).unwrap();
    let pd = dev.alloc_pd().unwrap();
    let cq = Arc::new(dev.create_cq(64).unwrap());
    let init = QpInit {
        caps: QpCaps {
            max_send_wr: 64,
            max_recv_wr: 1,
            ..QpCaps::default()
        },
        sq_sig_all: false,
    };
    let a = dev.create_qp(&pd, &cq, &cq, &init).unwrap();
    let b = dev.create_qp(&pd, &cq, &cq, &init).unwrap();
    connect_pair(&a, &b, &ConnectOptions::default()).unwrap();
    let local = dev.reg_mr(&pd, 64, Access::LOCAL_WRITE).unwrap();
    let remote = dev
        .reg_mr(&pd, 64, Access::LOCAL_WRITE | Access::REMOTE_WRITE)
        .unwrap();
    let mut q: SignaledQueue<SoftDevice, ()> =
        SignaledQueue::new(a, cq, Policy::Every(64)).unwrap();
    q.post(Work::write(Buffer::new(local), remote.remote(0), ()))
        .unwrap();
    // Let the NIC run the WRITE and settle.
    std::thread::sleep(Duration::from_millis(100));
    let (cpu, start) = (selsig_testkit::cpu::process_cpu(), Instant::now());
    let handed = q.wait_with(Duration::from_secs(5), drop).unwrap();
    let (used, waited) = (selsig_testkit::cpu::process_cpu() - cpu, start.elapsed());
    assert_eq!(handed, 0, "nothing retires: the WRITE is unsignaled");
    assert!(waited >= Duration::from_secs(5), "waited {waited:?}");
    let share = used.as_secs_f64() / waited.as_secs_f64();
    println!(
        "idle wait: {used:?} of CPU in {waited:?} ({:.3} % of a core)",
        share * 100.0
    );
    assert!(share < 0.01, "{used:?} of CPU in {waited:?}");
    assert_eq!(q.outstanding(), 1);
    drop(b);
}
