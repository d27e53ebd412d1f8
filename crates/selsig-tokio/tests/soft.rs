//! The async driver's stories on the software NIC (`stories/mod.rs`).

mod stories;

use selsig::ConnectOptions;
use selsig_soft::{SoftConfig, SoftDevice};

impl stories::Rig for SoftDevice {
    fn options(&self) -> ConnectOptions {
        ConnectOptions::default()
    }
}

fn soft() -> SoftDevice {
    SoftDevice::open(SoftConfig::default()).unwrap()
}

#[tokio::test]
async fn the_seed_story_retires_in_order_with_two_completions() {
    stories::seed(soft()).await;
}

#[tokio::test]
async fn an_error_and_its_flushes_give_every_work_request_its_outcome() {
    stories::error_and_flushes(soft()).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sixty_four_queue_pairs_on_one_cq_each_retire_in_order() {
    stories::many_qps_on_one_cq(soft(), 500).await;
}

#[tokio::test(flavor = "current_thread")]
async fn sixty_four_queue_pairs_on_one_cq_in_one_thread() {
    stories::many_qps_on_one_cq(soft(), 100).await;
}

#[tokio::test]
async fn a_cancelled_post_or_next_loses_nothing() {
    stories::cancellation(soft()).await;
}

#[tokio::test]
async fn an_adaptive_tail_is_confirmed_at_its_deadline() {
    stories::adaptive_deadline(soft()).await;
}
