//! The idle cost of an async program: a queue on the software NIC whose SEND waits for a
//! receive that does not come (RNR retried for ever), its task awaiting the next retired
//! work request for 5 s, the poller asleep on the CQ's events. The whole process (the
//! runtime's threads and the NIC's) must use under 1 % of a core: measured with
//! `getrusage`, alone in this binary so that no other test's threads count.

#[allow(dead_code)]
mod stories;

use std::sync::Arc;
use std::time::{Duration, Instant};

use selsig::{Access, Buffer, ConnectOptions, Device, Policy, QueueConfig, Work};
use selsig_soft::{SoftConfig, SoftDevice};
use selsig_tokio::{AsyncCq, AsyncQueue};

impl stories::Rig for SoftDevice {
    fn options(&self) -> ConnectOptions {
        ConnectOptions::default()
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_async_queue_waiting_for_5_s_uses_under_1_percent_of_a_core() {
    let dev = SoftDevice::open(SoftConfig::default()).unwrap();
    let cq = Arc::new(dev.create_cq(64).unwrap());
    let acq = AsyncCq::<SoftDevice>::new(Arc::clone(&cq)).unwrap();
    let options = ConnectOptions {
        rnr_retry: 7,
        ..ConnectOptions::default()
    };
    let p = stories::pair(&dev, dev.alloc_pd().unwrap(), &cq, 16, options);
    let local = dev.reg_mr(&p.pd, 64, Access::LOCAL_WRITE).unwrap();
    let mut q: AsyncQueue<SoftDevice, u64> =
        AsyncQueue::new(&acq, p.a, QueueConfig::with_policy(Policy::Every(1))).unwrap();
    q.post(Work::send(Buffer::new(local), 1)).await.unwrap();
    tokio::time::sleep(Duration::from_millis(100)).await;
    let (cpu, start) = (selsig_testkit::cpu::process_cpu(), Instant::now());
    let next = tokio::time::timeout(Duration::from_secs(5), q.next()).await;
    let (used, waited) = (selsig_testkit::cpu::process_cpu() - cpu, start.elapsed());
    assert!(
        next.is_err(),
        "nothing retires: the SEND waits for a receive"
    );
    assert_eq!(q.outstanding(), 1);
    let share = used.as_secs_f64() / waited.as_secs_f64();
    println!(
        "idle async wait: {used:?} of CPU in {waited:?} ({:.3} % of a core)",
        share * 100.0
    );
    assert!(share < 0.01, "{used:?} of CPU in {waited:?}");
}
