//! The async driver's stories (`stories/mod.rs`) on a real RDMA device: the first one
//! rdma-core sees (in CI, the kernel's Soft-RoCE `rxe0` in the VM of
//! `scripts/verbs-tests.sh`), its completion events through a completion channel per CQ.
//!
//! Every test needs a device, so every test is `#[ignore]`d with the reason: on a host
//! without one they are reported as ignored, never as passed.

mod stories;

use selsig::ConnectOptions;
use selsig_verbs::{VerbsDevice, VerbsOptions};

const NEEDS_DEVICE: &str = "needs an RDMA device: run scripts/verbs-tests.sh (Soft-RoCE in a VM)";

impl stories::Rig for VerbsDevice {
    fn options(&self) -> ConnectOptions {
        ConnectOptions {
            gid_index: self.gid_index(),
            ..ConnectOptions::default()
        }
    }
}

fn device() -> VerbsDevice {
    let options = VerbsOptions {
        gid_index: std::env::var("SELSIG_GID_INDEX")
            .ok()
            .and_then(|g| g.parse().ok()),
        ..VerbsOptions::default()
    };
    VerbsDevice::open(&options).unwrap_or_else(|e| panic!("{NEEDS_DEVICE}: {e}"))
}

#[tokio::test]
#[ignore = "needs an RDMA device: run scripts/verbs-tests.sh (Soft-RoCE in a VM)"]
async fn the_seed_story_retires_in_order_with_two_completions() {
    stories::seed(device()).await;
}

#[tokio::test]
#[ignore = "needs an RDMA device: run scripts/verbs-tests.sh (Soft-RoCE in a VM)"]
async fn an_error_and_its_flushes_give_every_work_request_its_outcome() {
    stories::error_and_flushes(device()).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs an RDMA device: run scripts/verbs-tests.sh (Soft-RoCE in a VM)"]
async fn sixty_four_queue_pairs_on_one_cq_each_retire_in_order() {
    stories::many_qps_on_one_cq(device(), 100).await;
}

#[tokio::test]
#[ignore = "needs an RDMA device: run scripts/verbs-tests.sh (Soft-RoCE in a VM)"]
async fn a_cancelled_post_or_next_loses_nothing() {
    stories::cancellation(device()).await;
}

#[tokio::test]
#[ignore = "needs an RDMA device: run scripts/verbs-tests.sh (Soft-RoCE in a VM)"]
async fn an_adaptive_tail_is_confirmed_at_its_deadline() {
    stories::adaptive_deadline(device()).await;
}
