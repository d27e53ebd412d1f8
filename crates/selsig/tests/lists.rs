//! Work requests on scatter/gather lists through a `SignaledQueue`, on a fake device that
//! logs the entries it is given: the entries reach the provider in the list's order on
//! every posting path, the buffers come back in that order when retired, a list longer
//! than the QP's `max_send_sge` is refused before the post with its buffers back, and a
//! provider that posts a batch all or nothing (`ibv_wr_complete`) gets every buffer of a
//! refused batch handed back.

use std::collections::VecDeque;
use std::sync::{Arc, Mutex};

use selsig::{
    Buffer, Completion, CompletionQueue, ConnectOptions, CqError, Endpoint, Local, Opcode, Outcome,
    Policy, PostFailure, PostWrError, ProviderError, QpCaps, QpState, QueuePair, QueuePostError,
    RecvWr, RemoteAddr, SendWr, Seq, Signal, SignaledQueue, WcStatus, Work, WorkCompletion,
};
use selsig_testkit::null::{NullDevice, NullMr};

/// The CQ, filled by the tests.
struct FakeCq(Mutex<VecDeque<WorkCompletion>>);

impl CompletionQueue for FakeCq {
    fn capacity(&self) -> u32 {
        1024
    }
    fn poll(&self, out: &mut [WorkCompletion]) -> Result<usize, CqError> {
        let mut ring = self.0.lock().unwrap();
        let n = ring.len().min(out.len());
        for slot in out.iter_mut().take(n) {
            *slot = ring.pop_front().unwrap();
        }
        Ok(n)
    }
}

/// The local data of a posted work request: its entries as (address, length, lkey).
type Entries = Vec<(u64, u32, u32)>;

struct FakeQp {
    depth: u32,
    max_sge: u32,
    /// `post_send_iter_min`: 1 sends every batch through `post_send_iter`.
    iter_min: usize,
    /// All or nothing: a batch with a work request to remote key 0xbad is refused whole,
    /// its index 0, as `ibv_wr_complete` refuses (nothing of it posted).
    whole: bool,
    posted: Mutex<Vec<(u64, Entries)>>,
}

fn entries(local: &Local<'_>) -> Entries {
    match local {
        Local::Empty => Vec::new(),
        Local::Sge(s) => vec![(s.addr, s.length, s.lkey)],
        Local::Sges(list) => list.iter().map(|s| (s.addr, s.length, s.lkey)).collect(),
        Local::Inline(bytes) => vec![(0, bytes.len() as u32, 0)],
    }
}

impl QueuePair for FakeQp {
    fn qp_num(&self) -> u32 {
        7
    }
    fn caps(&self) -> QpCaps {
        QpCaps {
            max_send_wr: self.depth,
            max_recv_wr: 0,
            max_send_sge: self.max_sge,
            ..QpCaps::default()
        }
    }
    fn sq_sig_all(&self) -> bool {
        false
    }
    fn state(&self) -> QpState {
        QpState::Rts
    }
    fn endpoint(&self, _: &ConnectOptions) -> Result<Endpoint, ProviderError> {
        unreachable!()
    }
    fn connect(&self, _: &Endpoint, _: &ConnectOptions) -> Result<(), ProviderError> {
        Ok(())
    }
    fn to_error(&self) -> Result<(), ProviderError> {
        Ok(())
    }
    fn post_send(&self, wrs: &[SendWr<'_>]) -> Result<(), PostWrError> {
        if self.whole && wrs.iter().any(|w| w.remote.rkey == 0xbad) {
            return Err(PostWrError {
                index: 0,
                failure: PostFailure::Invalid("a bad work request in the batch"),
                source: None,
            });
        }
        let log = wrs.iter().map(|w| (w.wr_id, entries(&w.local)));
        self.posted.lock().unwrap().extend(log);
        Ok(())
    }
    fn post_send_iter_min(&self) -> usize {
        self.iter_min
    }
    fn post_recv(&self, _: &[RecvWr]) -> Result<(), PostWrError> {
        Ok(())
    }
}

type FakeDevice = NullDevice<FakeCq, FakeQp>;

type Queue = SignaledQueue<FakeDevice, u32>;

fn queue(max_sge: u32, iter_min: usize, whole: bool) -> (Queue, Arc<FakeCq>) {
    deep_queue(16, max_sge, iter_min, whole)
}

fn deep_queue(depth: u32, max_sge: u32, iter_min: usize, whole: bool) -> (Queue, Arc<FakeCq>) {
    let cq = Arc::new(FakeCq(Mutex::new(VecDeque::new())));
    let qp = FakeQp {
        depth,
        max_sge,
        iter_min,
        whole,
        posted: Mutex::new(Vec::new()),
    };
    let queue =
        SignaledQueue::new(qp, cq.clone(), Policy::Never).unwrap_or_else(|e| panic!("{}", e.error));
    (queue, cq)
}

/// `n` buffers of 16 bytes each, at 0x1000 + 16 i.
fn buffers(n: usize) -> Vec<Buffer<NullMr>> {
    let (parts, _) = Buffer::new(NullMr(16 * n + 16))
        .split_into(n, 16)
        .unwrap_or_else(|_| panic!("split"));
    parts
}

/// The (address, length) of each buffer.
fn spans(list: &[Buffer<NullMr>]) -> Vec<(u64, usize)> {
    list.iter().map(|b| (b.addr(), b.len())).collect()
}

/// The (address, length) of each buffer of a list handed back (none: not a list).
fn listed(list: Option<&Vec<Buffer<NullMr>>>) -> Vec<(u64, usize)> {
    spans(list.expect("a list back"))
}

/// A list of `buffers`, reversed so that the order is not the addresses'.
fn reversed(mut list: Vec<Buffer<NullMr>>) -> Vec<Buffer<NullMr>> {
    list.reverse();
    list
}

fn remote() -> RemoteAddr {
    RemoteAddr {
        addr: 0x9000,
        rkey: 5,
    }
}

/// Confirms every work request posted so far (the completion of the last, which the test
/// signaled) and collects them.
fn retire(queue: &mut Queue, cq: &FakeCq, last: u64) -> Vec<Completion<NullMr, u32>> {
    let wr_id = Seq(last).0 | selsig::SEND_WR_ID_BIT;
    cq.0.lock()
        .unwrap()
        .push_back(WorkCompletion::new(wr_id, WcStatus::Success, 7));
    let mut out = Vec::new();
    queue.poll(&mut out).unwrap();
    out
}

#[test]
fn a_lists_entries_reach_the_provider_in_order_and_its_buffers_come_back_in_order() {
    // post_send (staged) and post_send_iter, then `post` alone.
    for iter_min in [usize::MAX, 1] {
        let (mut queue, cq) = queue(4, iter_min, false);
        let lists: Vec<_> = (0..3).map(|_| reversed(buffers(3))).collect();
        let want: Vec<_> = lists.iter().map(|l| spans(l)).collect();
        let mut works = lists
            .into_iter()
            .zip(1..)
            .map(|(list, user)| Work::list(Opcode::RdmaWrite, list, remote(), user))
            .chain(std::iter::once(Work::write(
                buffers(1).remove(0),
                remote(),
                4,
            )));
        assert_eq!(
            queue.post_batch(&mut works).unwrap(),
            4,
            "iter_min {iter_min}"
        );
        let mut single = buffers(2);
        single.swap(0, 1);
        let want_single = spans(&single);
        queue
            .post(Work::list(Opcode::RdmaRead, single, remote(), 5).signal(Signal::Force))
            .unwrap();
        let posted = queue.qp().posted.lock().unwrap().clone();
        let given: Vec<Vec<(u64, usize)>> = posted
            .iter()
            .map(|(_, e)| {
                e.iter()
                    .map(|&(a, l, k)| {
                        assert_eq!(k, 1, "the region's lkey");
                        (a, l as usize)
                    })
                    .collect()
            })
            .collect();
        assert_eq!(&given[..3], &want[..], "iter_min {iter_min}");
        assert_eq!(given[3].len(), 1, "a buffer is one entry");
        assert_eq!(given[4], want_single);
        let done = retire(&mut queue, &cq, 5);
        assert_eq!(done.len(), 5);
        for (c, want) in done.iter().zip(want.iter().chain([&want_single])) {
            if c.user == 4 {
                continue;
            }
            assert_eq!(c.outcome, Outcome::Completed);
            assert!(
                c.buffer.is_none(),
                "{}: a list's buffers come back in list",
                c.user
            );
            assert_eq!(&listed(c.list.as_deref()), want, "{}", c.user);
        }
        assert!(done[3].list.is_none() && done[3].buffer.is_some());
    }
}

#[test]
fn a_list_longer_than_max_send_sge_is_refused_before_the_post_with_its_buffers() {
    let (mut queue, _cq) = queue(2, usize::MAX, false);
    let list = buffers(3);
    let want = spans(&list);
    match queue.post(Work::list(Opcode::Send, list, RemoteAddr::default(), 1)) {
        Err(QueuePostError::Invalid { work, source }) => {
            assert_eq!(
                listed(work.list.as_deref()),
                want,
                "every buffer back, in order"
            );
            assert_eq!(work.user, 1);
            let e = source.to_string();
            assert!(
                e.contains("3 entries, more than the queue pair's max_send_sge of 2"),
                "{e}"
            );
        }
        other => panic!("not refused: {other:?}"),
    }
    assert_eq!(queue.outstanding(), 0);
    assert!(
        queue.qp().posted.lock().unwrap().is_empty(),
        "nothing posted"
    );
    // The same in a batch: those before it are posted, it comes back.
    let mut works = vec![
        Work::list(Opcode::RdmaWrite, buffers(2), remote(), 1),
        Work::list(Opcode::RdmaWrite, buffers(3), remote(), 2),
    ]
    .into_iter();
    match queue.post_batch(&mut works) {
        Err(QueuePostError::Invalid { work, .. }) => {
            assert_eq!((work.user, work.list.map(|l| l.len())), (2, Some(3)))
        }
        other => panic!("not refused: {other:?}"),
    }
    assert_eq!(queue.outstanding(), 1);
}

#[test]
fn an_all_or_nothing_provider_that_refuses_a_batch_gets_every_buffer_back() {
    for iter_min in [usize::MAX, 1] {
        let (mut queue, _cq) = queue(4, iter_min, true);
        let lists: Vec<_> = (0..4).map(|_| buffers(2)).collect();
        let want: Vec<_> = lists.iter().map(|l| spans(l)).collect();
        let mut works = lists.into_iter().zip(1..).map(|(list, user)| {
            // The third names the remote key the provider refuses.
            let to = if user == 3 {
                RemoteAddr {
                    addr: 0,
                    rkey: 0xbad,
                }
            } else {
                remote()
            };
            Work::list(Opcode::RdmaWrite, list, to, user)
        });
        match queue.post_batch(&mut works) {
            Err(QueuePostError::Provider { returned, source }) => {
                assert_eq!(source.index, 0);
                let back: Vec<_> = returned
                    .iter()
                    .map(|p| (p.user, listed(p.list.as_deref())))
                    .collect();
                let want: Vec<_> = (1..).zip(want).collect();
                assert_eq!(back, want, "iter_min {iter_min}: all four, in order");
            }
            other => panic!("iter_min {iter_min}: not refused: {other:?}"),
        }
        assert_eq!(queue.outstanding(), 0, "iter_min {iter_min}");
        assert!(queue.qp().posted.lock().unwrap().is_empty());
    }
}

/// On a queue pair that takes lists, one batch takes at most `LIST_BATCH` work requests
/// (the entries of each are written to the queue's arena, sized for that many): the rest
/// stay in the iterator for the next call. A queue pair of one entry takes them all.
#[test]
fn a_batch_on_a_queue_pair_that_takes_lists_is_cut_at_list_batch() {
    for (max_sge, want) in [(2, selsig::LIST_BATCH as usize), (1, 300)] {
        for iter_min in [usize::MAX, 1] {
            let (mut queue, _cq) = deep_queue(512, max_sge, iter_min, false);
            let mut works = buffers(300)
                .into_iter()
                .map(|b| Work::write(b, remote(), 0));
            assert_eq!(
                queue.post_batch(&mut works).unwrap(),
                want,
                "max_sge {max_sge}"
            );
            assert_eq!(works.count(), 300 - want);
        }
    }
}
