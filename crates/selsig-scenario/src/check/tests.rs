//! The checker: what it takes, what it refuses, and the line of every error.

use selsig::{Access, Policy};

use super::checker::{MAX_COUNT, MAX_REGION, MAX_TOTAL};
use super::*;
use crate::model::{Fault, Fill, Op, QpRef, parse_outcome_range};

const OK: &str = r#"
description = "two WRITEs"
[[qp]]
name = "a"
[[region]]
name = "src"
size = 128
fill = "pattern"
[[region]]
name = "dst"
size = 128
access = ["local_write", "remote_write"]
[[step]]
post = { qp = "a", op = "write", local = "src", remote = "dst", size = 64, count = 2 }
[[step]]
poll = "idle"
"#;

fn error(text: &str) -> String {
    parse("x.toml", "x", text).unwrap_err().to_string()
}

#[test]
fn a_valid_scenario_parses() {
    let s = parse("x.toml", "x", OK).unwrap();
    assert_eq!(s.steps.len(), 2);
    assert_eq!(s.cqs.len(), 2, "a send CQ and a peer CQ of their own");
    assert_eq!(
        s.qp_name(QpRef {
            index: 0,
            peer: true
        }),
        "a.peer"
    );
}

/// Policy names as the library reads them: spaces around and case aside, `manual` too.
#[test]
fn policy_names_take_any_case() {
    for (name, want) in [
        (" MANUAL", Policy::Never),
        ("Manual", Policy::Never),
        ("never", Policy::Never),
        ("ALWAYS ", Policy::Always),
        ("Every:8", Policy::Every(8)),
    ] {
        let text = OK.replace("name = \"a\"", &format!("name = \"a\"\npolicy = {name:?}"));
        let s = parse("x.toml", "x", &text).unwrap_or_else(|e| panic!("{name}: {e}"));
        assert_eq!(s.qps[0].policy, want, "{name}");
    }
    let e = error(&OK.replace("name = \"a\"", "name = \"a\"\npolicy = \"manually\""));
    assert!(
        e.contains("unknown policy \"manually\": expected every:N, always, never or manual"),
        "{e}"
    );
}

#[test]
fn errors_name_the_file_line_and_problem() {
    let e = error(&OK.replace("size = 64, count = 2", "size = 64, count = 3"));
    assert!(e.starts_with("x.toml:13:1: step 1:"), "{e}");
    assert!(e.contains("beyond region \"src\""), "{e}");
    let e = error(&OK.replace("remote = \"dst\"", "remote = \"dts\""));
    assert!(
        e.starts_with("x.toml:13:1: step 1: no region named \"dts\""),
        "{e}"
    );
    let e = error(&OK.replace("fill = \"pattern\"", "fill = \"pattern\"\ncolour = 3"));
    assert!(
        e.starts_with("x.toml:9:1:") && e.contains("unknown field `colour`"),
        "{e}"
    );
    let e = error(&OK.replace("op = \"write\"", "op = \"swap\""));
    assert!(e.contains("unknown op \"swap\""), "{e}");
    let e = error("description = 3");
    assert!(e.starts_with("x.toml:1:"), "{e}");
    let e = error(&OK.replace("size = 128\nfill", "size = 0\nfill"));
    assert!(e.contains("size 0 is out of range"), "{e}");
    for field in ["rnr_retry", "retry_cnt"] {
        let e = error(&OK.replace("name = \"a\"", &format!("name = \"a\"\n{field} = 8")));
        assert!(
            e.contains(&format!("qp \"a\": {field} 8 is out of range 0..=7")),
            "{e}"
        );
        let s = parse(
            "x.toml",
            "x",
            &OK.replace("name = \"a\"", &format!("name = \"a\"\n{field} = 3")),
        )
        .unwrap();
        let q = &s.qps[0];
        assert_eq!(
            (q.rnr_retry, q.retry_cnt),
            if field == "rnr_retry" { (3, 7) } else { (7, 3) }
        );
    }
    let e = error(&OK.replace("poll = \"idle\"", "poll = \"soon\""));
    assert!(e.contains("expected \"idle\""), "{e}");
    let e = error(&format!("{OK}\n[[step]]\nconfirm = \"a\"\ndrain = \"a\"\n"));
    assert!(e.contains("exactly one of"), "{e}");
    // Registration rules are checked with the file, not when the region is registered.
    let e = error(&OK.replace("[\"local_write\", \"remote_write\"]", "[\"remote_write\"]"));
    assert!(
        e.starts_with(
            "x.toml:9:1: region \"dst\": remote_write and remote_atomic need local_write too"
        ),
        "{e}"
    );
}

/// `OK` with `extra` after the QP's name.
fn qp_with(extra: &str) -> String {
    OK.replace("name = \"a\"", &format!("name = \"a\"\n{extra}"))
}

/// `OK` with its post's `size = 64, count = 2` replaced.
fn post_with(fields: &str) -> String {
    OK.replace("size = 64, count = 2", fields)
}

/// Asserts that `text` parses, naming `what` if not.
fn parses(what: &str, text: &str) -> Scenario {
    parse("x.toml", "x", text).unwrap_or_else(|e| panic!("{what}: {e}"))
}

/// Asserts that `text` is refused with an error containing `problem`.
fn refused(what: &str, text: &str, problem: &str) {
    match parse("x.toml", "x", text) {
        Ok(_) => panic!("{what}: taken"),
        Err(e) => {
            let e = e.to_string();
            assert!(e.contains(problem), "{what}: {e}\nshould say: {problem}");
        }
    }
}

#[test]
fn each_limit_is_taken_at_its_bound_and_refused_one_beyond() {
    let cq = |size: u64| {
        format!(
            "{}\n[[cq]]\nname = \"c\"\nsize = {size}\n",
            qp_with("send_cq = \"c\"")
        )
    };
    parses("cq 1048576", &cq(1 << 20));
    refused(
        "cq 1048577",
        &cq((1 << 20) + 1),
        "cq \"c\": size 1048577 is out of range 1..=1048576",
    );
    for field in ["depth", "peer_depth"] {
        parses(field, &qp_with(&format!("{field} = 32768")));
        for bad in [0, 32769] {
            refused(
                field,
                &qp_with(&format!("{field} = {bad}")),
                &format!("qp \"a\": {field} {bad} is out of range 1..=32768"),
            );
        }
    }
    let src = |size: u64| OK.replace("size = 128\nfill", &format!("size = {size}\nfill"));
    parses("region 64 MiB", &src(MAX_REGION));
    refused(
        "region 64 MiB + 1",
        &src(MAX_REGION + 1),
        "region \"src\": size 67108865 is out of range 1..=67108864",
    );
    // OK's two regions take 256 bytes; fifteen of 64 MiB and one of `last` bytes more.
    let regions = |last: u64| {
        let mut text = OK.to_string();
        for i in 0..15 {
            text.push_str(&format!(
                "\n[[region]]\nname = \"big{i}\"\nsize = {MAX_REGION}\n"
            ));
        }
        text + &format!("\n[[region]]\nname = \"last\"\nsize = {last}\n")
    };
    parses("regions of 1 GiB", &regions(MAX_REGION - 256));
    refused(
        "regions of 1 GiB + 1",
        &regions(MAX_REGION - 255),
        "region \"last\": the regions take more than 1073741824 bytes together",
    );
    // Steps posting `counts` zero-length WRITEs after OK's two.
    let posts = |counts: &[u64]| {
        let mut text = OK.to_string();
        for count in counts {
            text.push_str(&format!(
                "\n[[step]]\npost = {{ qp = \"a\", op = \"write\", remote = \"dst\", count = {count} }}\n"
            ));
        }
        text
    };
    parses("count 2^20", &posts(&[MAX_COUNT]));
    refused(
        "count 2^20 + 1",
        &posts(&[MAX_COUNT + 1]),
        "step 3: count 1048577 is out of range 1..=1048576",
    );
    parses("2^21 in all", &posts(&[MAX_COUNT, MAX_COUNT - 2]));
    refused(
        "2^21 + 1 in all",
        &posts(&[MAX_COUNT, MAX_COUNT - 1]),
        "step 4: the steps so far post 2097153 work requests and receives: a scenario \
         posts at most 2097152",
    );
    // Receives count too: 32768 of them, after OK's two WRITEs, then WRITEs up to one
    // beyond the total.
    let recv = format!(
        "{}\n[[step]]\nrecv = {{ qp = \"a.peer\", count = 32768 }}\n",
        qp_with("peer_depth = 32768")
    );
    let writes = |count: u64| {
        format!(
            "\n[[step]]\npost = {{ qp = \"a\", op = \"write\", remote = \"dst\", count = {count} }}\n"
        )
    };
    let last = MAX_TOTAL - 2 - 32768 - MAX_COUNT;
    parses(
        "receives in all",
        &(recv.clone() + &writes(MAX_COUNT) + &writes(last)),
    );
    refused(
        "receives in all, and one more",
        &(recv + &writes(MAX_COUNT) + &writes(last + 1)),
        "step 5: the steps so far post 2097153 work requests and receives",
    );
    refused(
        "size 64 MiB + 1",
        &post_with("size = 67108865, count = 1"),
        "step 1: size 67108865 is larger than any region (67108864)",
    );
    for field in ["stride", "local_offset", "remote_offset"] {
        refused(
            field,
            &post_with(&format!("size = 64, count = 2, {field} = 67108865")),
            &format!("step 1: {field} 67108865 is larger than any region (67108864)"),
        );
    }
    // At the bound, the region is what is too small.
    refused(
        "stride 64 MiB",
        &post_with("size = 64, count = 2, stride = 67108864"),
        "step 1: the local bytes end at 67108928, beyond region \"src\" (128 bytes)",
    );
    // The two WRITEs end exactly at the end of both 128-byte regions; one byte on is
    // beyond.
    refused(
        "local_offset 1",
        &post_with("size = 64, count = 2, local_offset = 1"),
        "step 1: the local bytes end at 129, beyond region \"src\" (128 bytes)",
    );
    refused(
        "remote_offset 1",
        &post_with("size = 64, count = 2, remote_offset = 1"),
        "step 1: the remote bytes end at 129, beyond region \"dst\" (128 bytes)",
    );
    parses(
        "inline 64",
        &post_with("size = 64, count = 2, inline = true"),
    );
    refused(
        "inline 65",
        &post_with("size = 65, count = 1, inline = true"),
        "step 1: inline data is for WRITEs and SENDs of at most 64 bytes",
    );
    let name32 = "n".repeat(32);
    parses(
        "a 32-character name",
        &OK.replace("\"a\"", &format!("{name32:?}")),
    );
    for bad in ["n".repeat(33), "x.peer".to_string(), "x.cq".to_string()] {
        refused(
            &bad,
            &OK.replace("\"a\"", &format!("{bad:?}")),
            &format!("qp name {bad:?}: use 1 to 32 letters, digits, '_' or '-'"),
        );
    }
}

#[test]
fn defaults_are_what_the_format_documents() {
    let s = parses("OK", OK);
    let q = &s.qps[0];
    assert_eq!((q.depth, q.peer_depth), (16, 16));
    assert_eq!(q.policy, Policy::Every(4));
    assert_eq!((q.rnr_retry, q.retry_cnt), (7, 7));
    assert_eq!(q.peer_access, Access::REMOTE_WRITE | Access::REMOTE_READ);
    // Every work request can complete in error: two entries per slot, and a marker's.
    let sizes: Vec<_> = s.cqs.iter().map(|c| (c.name.as_str(), c.size)).collect();
    assert_eq!(sizes, [("a.cq", 34), ("a.peer.cq", 34)]);
    let s = parses("depths", &qp_with("depth = 8\npeer_depth = 100"));
    assert_eq!((s.cqs[0].size, s.cqs[1].size), (18, 202));
    // A region's access is empty unless given; its fill zero.
    assert_eq!(s.regions[0].access, Access::empty());
    assert_eq!(s.regions[0].fill, Fill::Pattern);
    assert_eq!(s.regions[1].fill, Fill::Zero);
}

#[test]
fn region_fields_are_read_as_written() {
    let access = |list: &str| {
        let text = OK.replace("[\"local_write\", \"remote_write\"]", list);
        parses(list, &text).regions[1].access
    };
    assert_eq!(access("[\"local_write\"]"), Access::LOCAL_WRITE);
    assert_eq!(
        access("[\"local_write\", \"remote_read\"]"),
        Access::LOCAL_WRITE | Access::REMOTE_READ
    );
    assert_eq!(
        access("[\"local_write\", \"remote_atomic\"]"),
        Access::LOCAL_WRITE | Access::REMOTE_ATOMIC
    );
    refused(
        "remote_atomic alone",
        &OK.replace("[\"local_write\", \"remote_write\"]", "[\"remote_atomic\"]"),
        "region \"dst\": remote_write and remote_atomic need local_write too",
    );
    let fill = |value: &str| OK.replace("fill = \"pattern\"", &format!("fill = {value}"));
    assert_eq!(
        parses("fill 255", &fill("255")).regions[0].fill,
        Fill::Byte(255)
    );
    for bad in ["256", "-1"] {
        refused(
            bad,
            &fill(bad),
            &format!("region \"src\": fill {bad} is not \"zero\", \"pattern\" or a byte 0..=255"),
        );
    }
    assert!(parses("pd other", &fill("\"zero\"\npd = \"other\"")).regions[0].other_pd);
    refused(
        "pd second",
        &fill("\"zero\"\npd = \"second\""),
        "region \"src\": pd \"second\" is not \"main\" or \"other\"",
    );
}

#[test]
fn fields_that_would_be_ignored_or_misread_are_refused() {
    refused(
        "imm on a send",
        &OK.replace(
            "op = \"write\", local = \"src\", remote = \"dst\", size = 64, count = 2",
            "op = \"send\", size = 0, imm = 5",
        ),
        "step 1: imm: a send carries no immediate data (write_imm and send_imm do)",
    );
    refused(
        "bad_lkey inline",
        &post_with("size = 64, count = 1, inline = true, fault = \"bad_lkey\""),
        "step 1: fault \"bad_lkey\" needs a local region, not inline data",
    );
    refused(
        "post on a peer",
        &OK.replace("qp = \"a\", op", "qp = \"a.peer\", op"),
        "x.toml:13:1: step 1: \"a.peer\": this step needs a requester QP, not a peer",
    );
    refused(
        "stride of one",
        &post_with("size = 64, count = 1, stride = 128"),
        "step 1: stride with count 1: it moves the offsets of later work requests",
    );
    parses(
        "stride of two",
        &post_with("size = 32, count = 2, stride = 64"),
    );
    refused(
        "inline nothing",
        &post_with("size = 0, inline = true"),
        "step 1: inline with size 0: a zero-length transfer carries no data",
    );
    refused(
        "peer_access local_write",
        &qp_with("peer_access = [\"remote_write\", \"local_write\"]"),
        "x.toml:3:1: qp \"a\": peer_access: local_write is a region's flag, not a queue pair's",
    );
    refused(
        "peer_access unknown",
        &qp_with("peer_access = [\"rw\"]"),
        "x.toml:3:1: qp \"a\": peer_access: unknown access \"rw\"",
    );
    refused(
        "region access unknown",
        &OK.replace("[\"local_write\", \"remote_write\"]", "[\"rw\"]"),
        "region \"dst\": unknown access \"rw\"",
    );
    refused(
        "a cq of no QP",
        &format!("{OK}\n[[cq]]\nname = \"c\"\nsize = 8\n"),
        "cq \"c\": no QP reports to it (name it in a QP's send_cq or peer_cq)",
    );
    parses(
        "a cq of a peer",
        &format!(
            "{}\n[[cq]]\nname = \"c\"\nsize = 40\n",
            qp_with("peer_cq = \"c\"")
        ),
    );
    for step in ["confirm", "drain"] {
        refused(
            step,
            &format!("{OK}\n[[step]]\n{step} = \"a.peer\"\n"),
            "\"a.peer\": this step needs a requester QP, not a peer",
        );
    }
    refused(
        "recv cnt",
        &format!("{OK}\n[[step]]\nrecv = {{ qp = \"a.peer\", cnt = 4 }}\n"),
        "unknown field `cnt`",
    );
    let expect = |body: &str| format!("{OK}\n[expect]\n{body}\n");
    refused(
        "differs.mlx5",
        &expect("[expect.rxe]\nevents = []\n[differs]\nrxe = \"x\"\nmlx5 = \"y\""),
        "differs.mlx5: the only provider that may differ is rxe",
    );
    refused(
        "expect.rxe.rxe",
        &expect("[expect.rxe]\nevents = []\n[expect.rxe.rxe]\nevents = []\n[differs]\nrxe = \"x\""),
        "expect.rxe.rxe: one level only",
    );
    for bad in ["1fb4", "1fb4000000000000000", "1fb400000000000g"] {
        refused(
            bad,
            &expect(&format!("digests = {{ dst = {bad:?} }}")),
            &format!("expect.digests.dst: {bad:?} is not 16 hex digits"),
        );
    }
    refused(
        "qp_req_err",
        &expect("events = [\"qp_req_err\"]"),
        "expect.events: \"qp_req_err\": name the qp, as \"qp_req_err:a\"",
    );
    refused(
        "cq_err:a",
        &expect("events = [\"cq_err:a\"]"),
        "expect.events: \"cq_err:a\": cq_err names no qp (drop \":a\")",
    );
}

/// An error in `[expect]` or `[differs]` names the line and column of the entry at fault,
/// not the table's header (`OK` ends on line 16; `[expect]` is on line 18).
#[test]
fn expectation_errors_name_the_line_of_their_entry() {
    let at = |body: &str, want: &str| {
        let text = format!("{OK}\n[expect]\n{body}\n");
        let e = error(&text);
        assert!(
            e.starts_with(want),
            "{body}:\n{e}\nshould start with: {want}"
        );
    };
    at(
        "events = []\ncqes = [\n  { qp = \"a\", wr_id = 1, status = \"success\" },\n  \
         { qp = \"b\", wr_id = 2, status = \"success\" },\n]",
        "x.toml:22:3: expect.cqes: no qp named \"b\"",
    );
    at(
        "cqes = [\n  { qp = \"a\", wr_id = 1, status = \"success\" },\n  \
         { qp = \"a\", wr_id = 2, status = \"nope\" },\n]",
        "x.toml:21:3: expect.cqes: unknown status \"nope\"",
    );
    at(
        "cqes = [\n  { qp = \"a\", wr_id = 1, status = \"success\", opcode = \"rdma_write\", \
         imm = 1 },\n]",
        "x.toml:20:3: expect.cqes: imm of a wr_id 1 success rdma_write completion: immediate \
         data comes only in successful completions of receives",
    );
    at(
        "cqes = [\n  { qp = \"a\", wr_id = 1, status = \"rem_access_err\", imm = 1 },\n]",
        "x.toml:20:3: expect.cqes: imm of a wr_id 1 rem_access_err completion: immediate",
    );
    at(
        "events = []\n[expect.outcomes]\na = [\"1 completed\"]\nb = [\"1 completed\"]",
        "x.toml:22:5: expect.outcomes: no qp named \"b\"",
    );
    at(
        "events = []\n[expect.outcomes]\na = [\"1 completed\", \"x completed\"]",
        "x.toml:21:21: expect.outcomes.a: ",
    );
    // Of two overlapping ranges, the later in the file is at fault.
    at(
        "[expect.outcomes]\na = [\n  \"3 completed\",\n  \"1-3 flushed\",\n]",
        "x.toml:22:3: expect.outcomes.a: \"1-3 flushed\" and \"3 completed\" overlap",
    );
    at(
        "events = []\n[expect.digests]\ndst = \"0123456789abcdef\"\nsrc = \"1fb4\"",
        "x.toml:22:7: expect.digests.src: \"1fb4\" is not 16 hex digits",
    );
    at(
        "[expect.digests]\nnone = \"0123456789abcdef\"",
        "x.toml:20:8: expect.digests: no region named \"none\"",
    );
    at(
        "events = [\n  \"cq_err\",\n  \"qp_req_err\",\n]",
        "x.toml:21:3: expect.events: \"qp_req_err\": name the qp",
    );
    // Inside `[expect.rxe]`, its own entries' lines.
    at(
        "events = []\n[expect.rxe]\nevents = [\n  \"cq_err\",\n  \"qp_fatal:z\",\n]\n\
         [differs]\nrxe = \"why\"",
        "x.toml:23:3: expect.rxe.events: \"qp_fatal:z\": no qp named \"z\"",
    );
    // The rules on `[expect.rxe]` as a whole name its header, and `[differs]`'s rules
    // the entry they are about.
    at(
        "events = []\n[expect.rxe]\nevents = []",
        "x.toml:20:1: [expect.rxe] needs differs.rxe",
    );
    at(
        "events = []\n[expect.rxe]\nevents = []\n[expect.rxe.rxe]\nevents = []\n\
         [differs]\nrxe = \"x\"",
        "x.toml:22:1: expect.rxe.rxe: one level only",
    );
    at(
        "[expect.rxe]\nevents = []\n[differs]\nrxe = \"x\"\nmlx5 = \"y\"",
        "x.toml:23:8: differs.mlx5: the only provider that may differ is rxe",
    );
    at(
        "[expect.rxe]\nevents = []\n[differs]\nrxe = \"  \"",
        "x.toml:22:7: differs.rxe is empty",
    );
}

#[test]
fn rxe_expectations_keep_what_they_do_not_replace() {
    let s = parses(
        "expect.rxe",
        &format!(
            "{OK}\n[expect]\n\
             cqes = [{{ qp = \"a\", wr_id = 2, status = \"success\", opcode = \"rdma_write\" }}]\n\
             outcomes = {{ a = [\"1-2 completed\"] }}\n\
             digests = {{ dst = \"0123456789abcdef\" }}\n\
             events = [\"qp_access_err:a.peer\"]\n\
             [expect.rxe]\nevents = []\n[differs]\nrxe = \"why\"\n"
        ),
    );
    let rxe = s.expect_rxe.as_ref().expect("rxe expectations");
    assert_eq!(rxe.events, Some(Vec::new()));
    assert_eq!(
        s.expect.events,
        Some(vec!["qp_access_err:a.peer".to_string()])
    );
    assert_eq!(rxe.cqes, s.expect.cqes);
    assert!(rxe.cqes.as_ref().is_some_and(|c| c.len() == 1));
    assert_eq!(rxe.outcomes, s.expect.outcomes);
    assert!(rxe.outcomes.is_some());
    assert_eq!(rxe.digests, s.expect.digests);
    assert!(rxe.digests.is_some());
    assert_eq!(s.differs.get("rxe").map(String::as_str), Some("why"));
}

#[test]
fn outcome_ranges() {
    assert_eq!(
        parse_outcome_range("1-2 completed").unwrap(),
        (1, 2, "completed".into(), None)
    );
    assert_eq!(
        parse_outcome_range("3 failed:rem_access_err").unwrap(),
        (3, 3, "failed".into(), Some("rem_access_err".into()))
    );
    assert!(parse_outcome_range("2-1 completed").is_err());
    assert!(parse_outcome_range("3 failed").is_err());
    assert!(parse_outcome_range("3 failed:nope").is_err());
    // Outcomes no work request can have.
    assert_eq!(
        parse_outcome_range("1-4 failed:success").unwrap_err(),
        "\"1-4 failed:success\": a work request whose completion is success is completed, \
         never failed (write \"1-4 completed\")"
    );
    assert_eq!(
        parse_outcome_range("5 failed:wr_flush_err").unwrap_err(),
        "\"5 failed:wr_flush_err\": a work request whose completion is wr_flush_err is \
         flushed, never failed (write \"5 flushed\")"
    );
    assert!(parse_outcome_range("x completed").is_err());
}

/// `device_fatal = true` once; after it only `poll = "idle"` and `drain`, and those wait
/// for no receive (a lost device completes none).
#[test]
fn device_fatal_is_followed_only_by_steps_that_wait_for_nothing() {
    let fatal = OK.replace(
        "[[step]]\npoll = \"idle\"",
        "[[step]]\ndevice_fatal = true\n[[step]]\npoll = \"idle\"\n[[step]]\ndrain = \"a\"",
    );
    let s = parses("device_fatal then idle and drain", &fatal);
    assert!(matches!(s.steps[1], Action::DeviceFatal));
    assert_eq!(s.steps[1].kind(), "device_fatal");
    refused(
        "device_fatal = false",
        &OK.replace("poll = \"idle\"", "device_fatal = false"),
        "step 2: device_fatal = false would change nothing",
    );
    for (step, kind) in [
        (
            "post = { qp = \"a\", op = \"write\", local = \"src\", remote = \"dst\", size = 8 }",
            "post",
        ),
        ("confirm = \"a\"", "confirm"),
        ("poll = { cqes = 1 }", "poll"),
        ("to_error = \"a\"", "to_error"),
        ("dereg = \"dst\"", "dereg"),
        ("device_fatal = true", "device_fatal"),
    ] {
        refused(
            kind,
            &fatal.replace("drain = \"a\"", step),
            &format!("step 4: a {kind} step after the device_fatal of step 2"),
        );
    }
    // Receives no SEND uses would make `poll = "idle"` wait for ever, but not after the
    // device is lost.
    let recv = "[[step]]\nrecv = { qp = \"a.peer\", count = 1 }\n[[step]]\npoll = \"idle\"";
    refused(
        "idle with an unused receive",
        &OK.replace("[[step]]\npoll = \"idle\"", recv),
        "wait",
    );
    parses(
        "idle with an unused receive after device_fatal",
        &OK.replace(
            "[[step]]\npoll = \"idle\"",
            &recv.replace(
                "[[step]]\npoll",
                "[[step]]\ndevice_fatal = true\n[[step]]\npoll",
            ),
        ),
    );
}

/// Atomics: 8 bytes at an aligned remote address, their operands on them alone.
#[test]
fn atomics_take_their_operands_and_8_aligned_bytes() {
    let atomic = |fields: &str| {
        OK.replace(
            "op = \"write\", local = \"src\", remote = \"dst\", size = 64, count = 2",
            fields,
        )
    };
    let s = parses(
        "fetch_add",
        &atomic("op = \"fetch_add\", local = \"src\", remote = \"dst\", count = 2"),
    );
    let Action::Post(p) = &s.steps[0] else {
        panic!("a post")
    };
    assert_eq!((p.op, p.size, p.stride), (Op::FetchAdd { add: 1 }, 8, 8));
    let s = parses(
        "cmp_swap",
        &atomic(
            "op = \"cmp_swap\", compare = 1, swap = 2, local = \"src\", remote = \"dst\", size = 8",
        ),
    );
    let Action::Post(p) = &s.steps[0] else {
        panic!("a post")
    };
    assert_eq!(
        p.op,
        Op::CmpSwap {
            compare: 1,
            swap: 2
        }
    );
    for (what, fields, problem) in [
        (
            "add on a write",
            "op = \"write\", add = 1, local = \"src\", remote = \"dst\", size = 8",
            "add is for fetch_add, not write",
        ),
        (
            "swap on fetch_add",
            "op = \"fetch_add\", swap = 1, local = \"src\", remote = \"dst\"",
            "swap is for cmp_swap, not fetch_add",
        ),
        (
            "cmp_swap without swap",
            "op = \"cmp_swap\", compare = 1, local = \"src\", remote = \"dst\"",
            "cmp_swap needs compare and swap",
        ),
        (
            "16 bytes",
            "op = \"fetch_add\", local = \"src\", remote = \"dst\", size = 16",
            "a fetch_add operates on 8 bytes: size 16",
        ),
        (
            "misaligned",
            "op = \"fetch_add\", local = \"src\", remote = \"dst\", remote_offset = 4",
            "must be 8-byte aligned: remote_offset 4 and stride 8",
        ),
        (
            "inline",
            "op = \"fetch_add\", local = \"src\", remote = \"dst\", inline = true",
            "inline data is for WRITEs and SENDs",
        ),
        (
            "out of bounds",
            "op = \"fetch_add\", local = \"src\", remote = \"dst\", fault = \"out_of_bounds\"",
            "are misaligned too",
        ),
        (
            "no remote",
            "op = \"fetch_add\", local = \"src\"",
            "a fetch_add needs a remote region",
        ),
        (
            "unknown",
            "op = \"atomic\", local = \"src\", remote = \"dst\"",
            "expected write, write_imm, read, send, send_imm, fetch_add or cmp_swap",
        ),
    ] {
        refused(what, &atomic(fields), problem);
    }
}

/// The misaligned fault is the atomics' alone.
#[test]
fn a_misaligned_fault_is_for_atomics() {
    let post = |fields: &str| {
        OK.replace(
            "op = \"write\", local = \"src\", remote = \"dst\", size = 64, count = 2",
            fields,
        )
    };
    parses(
        "a misaligned fetch_add",
        &post("op = \"fetch_add\", local = \"src\", remote = \"dst\", fault = \"misaligned\""),
    );
    refused(
        "a misaligned write",
        &post(
            "op = \"write\", local = \"src\", remote = \"dst\", size = 8, fault = \"misaligned\"",
        ),
        "fault \"misaligned\" is for the atomics, not write",
    );
}

#[test]
fn a_list_replaces_local_and_size_and_is_bounded() {
    let listed = |fields: &str| {
        OK.replace(
            "local = \"src\", remote = \"dst\", size = 64, count = 2",
            fields,
        )
    };
    let three = "list = [{ local = \"src\", size = 16 }, { local = \"src\", offset = 80, size = 8 }, { local = \"dst\", offset = 64, size = 8 }]";
    let s = parses(
        "a 3-entry list, twice",
        &listed(&format!("{three}, remote = \"dst\", count = 2")),
    );
    let Action::Post(p) = &s.steps[0] else {
        panic!("a post")
    };
    assert_eq!((p.size, p.stride, p.local), (32, 32, None));
    let entries: Vec<_> = p
        .list
        .iter()
        .map(|e| (e.region, e.offset, e.size))
        .collect();
    assert_eq!(entries, [(0, 0, 16), (0, 80, 8), (1, 64, 8)]);
    let s = parses(
        "a bad lkey in entry 3",
        &listed(&format!(
            "{three}, remote = \"dst\", fault = \"bad_lkey\", fault_entry = 3"
        )),
    );
    let Action::Post(p) = &s.steps[0] else {
        panic!("a post")
    };
    assert_eq!((p.fault, p.fault_entry), (Some((Fault::BadLkey, 1)), 2));
    let max = parses("max_send_sge", &qp_with("max_send_sge = 32"));
    assert_eq!(max.qps[0].max_send_sge, Some(32));
    for (what, text, problem) in [
        (
            "local and a list",
            listed(&format!("{three}, local = \"src\", remote = \"dst\"")),
            "local with a list",
        ),
        (
            "size and a list",
            listed(&format!("{three}, remote = \"dst\", size = 32")),
            "size with a list",
        ),
        (
            "an empty list",
            listed("list = [], remote = \"dst\""),
            "a list of 0 entries: a list has 1 to 32",
        ),
        (
            "33 entries",
            listed(&format!(
                "list = [{}], remote = \"dst\"",
                vec!["{ local = \"src\", size = 1 }"; 33].join(", ")
            )),
            "a list of 33 entries",
        ),
        (
            "a 0-byte entry",
            listed("list = [{ local = \"src\", size = 0 }], remote = \"dst\""),
            "an entry of 0 bytes",
        ),
        (
            "an entry beyond its region",
            listed("list = [{ local = \"src\", offset = 120, size = 16 }], remote = \"dst\""),
            "an entry of the list ends at 136, beyond region \"src\"",
        ),
        (
            "an entry of no region",
            listed("list = [{ local = \"nowhere\", size = 16 }], remote = \"dst\""),
            "nowhere",
        ),
        (
            "a list on an atomic",
            OK.replace(
                "op = \"write\", local = \"src\", remote = \"dst\", size = 64, count = 2",
                "op = \"fetch_add\", list = [{ local = \"src\", size = 8 }], remote = \"dst\"",
            ),
            "a fetch_add takes one local entry (local), not a list",
        ),
        (
            "fault_entry without a list",
            post_with("size = 64, fault = \"bad_lkey\", fault_entry = 1"),
            "fault_entry is for a bad_lkey on a post with a list",
        ),
        (
            "fault_entry beyond the list",
            listed(&format!(
                "{three}, remote = \"dst\", fault = \"bad_lkey\", fault_entry = 4"
            )),
            "fault_entry 4 names no entry of the list of 3",
        ),
        (
            "max_send_sge 0",
            qp_with("max_send_sge = 0"),
            "max_send_sge 0 is out of range 1..=32",
        ),
        (
            "max_send_sge 33",
            qp_with("max_send_sge = 33"),
            "max_send_sge 33 is out of range 1..=32",
        ),
    ] {
        refused(what, &text, problem);
    }
}

#[test]
fn batches_the_inline_too_long_fault_and_the_post_api_are_checked() {
    let inline = |fields: &str| {
        OK.replace(
            "local = \"src\", remote = \"dst\", size = 64, count = 2",
            &format!("local = \"src\", remote = \"dst\", {fields}"),
        )
    };
    let s = parses(
        "a batch with a fault",
        &inline(
            "size = 16, count = 3, inline = true, batch = true, fault = \"inline_too_long\", fault_at = 2",
        ),
    );
    let Action::Post(p) = &s.steps[0] else {
        panic!("a post")
    };
    assert_eq!((p.batch, p.fault), (true, Some((Fault::InlineTooLong, 2))));
    assert_eq!(s.post_api(), None);
    let extended = parses(
        "post_api",
        &OK.replace("[[qp]]", "[device]\npost_api = \"extended\"\n[[qp]]"),
    );
    assert_eq!(extended.post_api(), Some(selsig::PostApi::Extended));
    for (what, text, problem) in [
        (
            "a batch of 1",
            inline("size = 16, batch = true"),
            "a batch of 1 work requests: a batch has 2 up to the QP's depth (16)",
        ),
        (
            "a batch beyond the depth",
            inline("size = 1, count = 17, batch = true"),
            "a batch of 17 work requests",
        ),
        (
            "not inline",
            inline("size = 16, fault = \"inline_too_long\""),
            "fault \"inline_too_long\" is for inline WRITEs of at most 32 bytes",
        ),
        (
            "too large",
            inline("size = 48, inline = true, fault = \"inline_too_long\""),
            "fault \"inline_too_long\" is for inline WRITEs",
        ),
        (
            "64 bytes beyond the region",
            inline(
                "size = 16, count = 6, stride = 16, inline = true, fault = \"inline_too_long\", fault_at = 6",
            ),
            "the local bytes end at 144, beyond region \"src\"",
        ),
        (
            "an unknown API",
            OK.replace("[[qp]]", "[device]\npost_api = \"fast\"\n[[qp]]"),
            "device.post_api: unknown post API \"fast\"",
        ),
    ] {
        refused(what, &text, problem);
    }
}
