//! The safe API makes it impossible to reuse the buffer of a posted work request before
//! it is retired: the buffer moves into the queue and comes back on retirement, and no
//! other buffer of its region reaches its bytes.

#[test]
fn a_posted_buffer_cannot_be_reused_before_retirement() {
    let t = trybuild::TestCases::new();
    t.compile_fail("tests/ui/reuse_posted_buffer.rs");
    t.compile_fail("tests/ui/sibling_writes_posted_part.rs");
    t.pass("tests/ui/buffer_back_after_retirement.rs");
}
