//! What a scenario names, made on the device before its first step: protection domains,
//! CQs, each queue pair and its peer (connected), the queues with their CQ budgets, and
//! the regions (filled).

use std::collections::BTreeMap;
use std::sync::Arc;

use anyhow::{Context, Result, ensure};
use selsig::{
    Access, CompletionQueue, ConnectOptions, CqBudget, CqCredits, Device, MemoryRegion, QpCaps,
    QpInit, QueueConfig, QueuePair, RemoteAddr, SignaledQueue, WcStatus, WorkCompletion,
};

use crate::bytes::fill_pattern;
use crate::model::{Action, Fill, QpRef, Scenario};
use crate::remote::RemoteSide;

use super::runner::Runner;
use super::side::{KeyedRegion, Side};

/// Each queue pair of a scenario and its peer (`None`: on the remote side), connected.
struct Pairs<D: Device> {
    pairs: Vec<(D::Qp, Option<D::Qp>)>,
    /// The remote side's region, with one.
    target: Option<RemoteAddr>,
    /// QP number → endpoint.
    qpns: BTreeMap<u32, QpRef>,
    /// Receive slots of the peers reporting to each CQ.
    recv_slots: Vec<u32>,
}

/// A remote side, and the index of the region it holds.
pub(super) type Remote<'a, D> = (usize, &'a mut dyn RemoteSide<D>);

impl<'a, D: Device> Runner<'a, D> {
    /// Makes what `sc` names on `dev`, with its queue pair's peer and `remote.0`'s region
    /// on `remote.1` if given; `connect` says the port and GID index to connect with.
    pub fn new(
        sc: &'a Scenario,
        dev: &'a D,
        connect: &ConnectOptions,
        mut remote: Option<Remote<'a, D>>,
    ) -> Result<Self> {
        let pd = dev
            .alloc_pd()
            .context("cannot allocate a protection domain")?;
        let other = if sc.regions.iter().any(|r| r.other_pd) {
            Some(
                dev.alloc_pd()
                    .context("cannot allocate the second protection domain")?,
            )
        } else {
            None
        };
        let mut cqs = Vec::new();
        for c in &sc.cqs {
            cqs.push(Arc::new(
                dev.create_cq(c.size)
                    .with_context(|| format!("cannot create cq {:?}", c.name))?,
            ));
        }
        let Pairs {
            pairs,
            target,
            qpns,
            recv_slots,
        } = connect_pairs(sc, dev, &pd, &cqs, connect, remote.as_mut())?;
        let room = send_room::<D>(sc, &cqs, &recv_slots)?;
        let sides = queues(sc, &cqs, pairs, &room)?;
        let held = remote.as_ref().map(|(r, _)| *r).zip(target);
        let regions = register(sc, dev, &pd, other.as_ref(), held)?;
        Ok(Runner {
            sc,
            dev,
            cqs,
            sides,
            regions,
            trace: Vec::new(),
            qpns,
            wcs: vec![WorkCompletion::new(0, WcStatus::Success, 0); 64],
            stash: Vec::new(),
            deferred: Vec::new(),
            inject_fatal: None,
            lost: false,
            wait: super::runner::WAIT,
            remote,
            _pds: (pd, other),
        })
    }
}

/// The longest inline data the scenario posts on QP `index` (0 if none): what its QP
/// asks for.
fn inline_of(sc: &Scenario, index: usize) -> u32 {
    sc.steps
        .iter()
        .filter_map(|step| match step {
            Action::Post(p) if p.qp == index && p.inline => u32::try_from(p.size).ok(),
            _ => None,
        })
        .max()
        .unwrap_or(0)
}

/// The entries of the longest list a queue pair's posts carry, at least 1.
fn sges_of(sc: &Scenario, index: usize) -> u32 {
    sc.steps
        .iter()
        .filter_map(|step| match step {
            Action::Post(p) if p.qp == index => u32::try_from(p.list.len()).ok(),
            _ => None,
        })
        .max()
        .unwrap_or(0)
        .max(1)
}

/// Every queue pair and its peer, connected; with a `remote` side, the queue pair (the
/// scenario's one) to the remote side's.
fn connect_pairs<D: Device>(
    sc: &Scenario,
    dev: &D,
    pd: &D::Pd,
    cqs: &[Arc<D::Cq>],
    connect: &ConnectOptions,
    mut remote: Option<&mut Remote<'_, D>>,
) -> Result<Pairs<D>> {
    let mut pairs = Vec::new();
    let mut target = None;
    let mut qpns = BTreeMap::new();
    // Receive slots of the peers reporting to each CQ: every receive completes there
    // (if only flushed), so their entries are not the senders'.
    let mut recv_slots = vec![0u32; cqs.len()];
    for (index, q) in sc.qps.iter().enumerate() {
        // The requester posts no receives: one slot, whose completions never come. It
        // asks for the inline data its posts carry, no more: on mlx5 up to 60 bytes make
        // 256-byte WQEs and a send queue of a power of two WQEs, 61 to 64 make 320-byte
        // ones and another depth (semantics 13).
        let init = QpInit {
            caps: QpCaps {
                max_send_wr: q.depth,
                max_recv_wr: 1,
                max_inline_data: inline_of(sc, index),
                max_send_sge: q.max_send_sge.unwrap_or_else(|| sges_of(sc, index)),
                ..QpCaps::default()
            },
            sq_sig_all: q.sq_sig_all,
        };
        // The peer only receives.
        let peer_init = QpInit {
            caps: QpCaps {
                max_send_wr: 1,
                max_recv_wr: q.peer_depth,
                max_inline_data: 0,
                ..QpCaps::default()
            },
            sq_sig_all: false,
        };
        let send_cq = &cqs[q.send_cq];
        let peer_cq = &cqs[q.peer_cq];
        let qp = dev
            .create_qp(pd, send_cq, send_cq, &init)
            .with_context(|| format!("cannot create qp {:?}", q.name))?;
        let options = ConnectOptions {
            rnr_retry: q.rnr_retry,
            retry_cnt: q.retry_cnt,
            ..*connect
        };
        if let Some((r, side)) = remote.as_mut() {
            let len = sc.regions[*r].size as u64;
            let at = side
                .connect(&qp, &options, len)
                .with_context(|| format!("cannot connect qp {:?} to the remote side", q.name))?;
            target = Some(at);
            qpns.insert(qp.qp_num(), QpRef { index, peer: false });
            pairs.push((qp, None));
            continue;
        }
        let peer = dev
            .create_qp(pd, peer_cq, peer_cq, &peer_init)
            .with_context(|| format!("cannot create qp {:?}.peer", q.name))?;
        let peer_options = ConnectOptions {
            access: q.peer_access | Access::LOCAL_WRITE,
            ..options
        };
        let a = qp.endpoint(&options)?;
        let b = peer.endpoint(&peer_options)?;
        qp.connect(&b, &options)
            .with_context(|| format!("cannot connect qp {:?}", q.name))?;
        peer.connect(&a, &peer_options)
            .with_context(|| format!("cannot connect qp {:?}.peer", q.name))?;
        qpns.insert(qp.qp_num(), QpRef { index, peer: false });
        qpns.insert(peer.qp_num(), QpRef { index, peer: true });
        recv_slots[q.peer_cq] = recv_slots[q.peer_cq].saturating_add(peer.caps().max_recv_wr);
        pairs.push((qp, Some(peer)));
    }
    Ok(Pairs {
        pairs,
        target,
        qpns,
        recv_slots,
    })
}

/// What each CQ leaves for send completions, once the receive slots of the peers that
/// report to it (`recv_slots`) are counted out.
fn send_room<D: Device>(sc: &Scenario, cqs: &[Arc<D::Cq>], recv_slots: &[u32]) -> Result<Vec<u32>> {
    let mut room = Vec::new();
    for ((c, cq), recvs) in sc.cqs.iter().zip(cqs).zip(recv_slots) {
        let capacity = cq.capacity();
        ensure!(
            c.senders == 0 || capacity > *recvs,
            "cq {:?} holds {capacity} completions, no more than the {recvs} receive slots of \
             the peers that report to it: none is left for send completions",
            c.name
        );
        // The runner keeps at most a receive queue's depth of receives uncompleted, so
        // their completions fit in a CQ that holds one for each slot.
        ensure!(
            capacity >= *recvs,
            "cq {:?} holds {capacity} completions, fewer than the {recvs} receive slots of \
             the peers that report to it: their completions could overrun it",
            c.name
        );
        room.push(capacity.saturating_sub(*recvs));
    }
    Ok(room)
}

/// A `SignaledQueue` on each queue pair, with the CQ budget of its send CQ's `room`.
fn queues<D: Device>(
    sc: &Scenario,
    cqs: &[Arc<D::Cq>],
    pairs: Vec<(D::Qp, Option<D::Qp>)>,
    room: &[u32],
) -> Result<Vec<Side<D>>> {
    // A CQ several send queues report to gets one pool of credits.
    let pools: Vec<Option<CqCredits>> = sc
        .cqs
        .iter()
        .zip(room)
        .map(|(c, room)| (c.senders > 1).then(|| CqCredits::new(*room)))
        .collect();
    let mut sides = Vec::new();
    for (q, (qp, peer)) in sc.qps.iter().zip(pairs) {
        let send_cq = &cqs[q.send_cq];
        let config = QueueConfig {
            policy: q.policy,
            cq: Some(match &pools[q.send_cq] {
                Some(pool) => CqBudget::Shared(pool.clone()),
                None => CqBudget::Exclusive(room[q.send_cq]),
            }),
            ..QueueConfig::default()
        };
        let queue = SignaledQueue::with_config(qp, Arc::clone(send_cq), config)
            .with_context(|| format!("qp {:?}", q.name))?;
        sides.push(Side {
            queue,
            peer,
            peer_recvs: 0,
            peer_recv_done: 0,
            consumers: 0,
            peer_flushable: false,
        });
    }
    Ok(sides)
}

/// The regions, registered in `pd` (or `other`, the second protection domain) and filled;
/// the one a remote side holds (`held`: its index, and where it is) only named.
fn register<D: Device>(
    sc: &Scenario,
    dev: &D,
    pd: &D::Pd,
    other: Option<&D::Pd>,
    held: Option<(usize, RemoteAddr)>,
) -> Result<Vec<KeyedRegion<D::Mr>>> {
    let mut regions = Vec::new();
    for (i, r) in sc.regions.iter().enumerate() {
        if let Some((_, at)) = held.filter(|(h, _)| *h == i) {
            regions.push(KeyedRegion {
                mr: None,
                addr: at.addr,
                len: r.size,
                key_l: 0,
                key_r: at.rkey,
            });
            continue;
        }
        let on = if r.other_pd { other.unwrap_or(pd) } else { pd };
        let mr = dev
            .reg_mr(on, r.size, r.access)
            .with_context(|| format!("cannot register region {:?}", r.name))?;
        match r.fill {
            Fill::Zero => {}
            Fill::Pattern => {
                // The pattern of "work request" 0: distinct from any WRITE's bytes.
                mr.write(0, &fill_pattern(r.size))?
            }
            Fill::Byte(b) => mr.fill(0, r.size, b)?,
        }
        regions.push(KeyedRegion {
            addr: mr.addr(),
            len: mr.len(),
            key_l: mr.lkey(),
            key_r: mr.rkey(),
            mr: Some(mr),
        });
    }
    Ok(regions)
}
