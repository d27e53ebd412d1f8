//! Shrinking a failing scenario: drop steps, then cut posts down to one work request,
//! keeping each change after which the file is still a scenario and still fails.

use toml::{Table, Value};

/// The smallest scenario reached from `text` by dropping steps one at a time and cutting
/// posts' `count` to 1, each change kept only when the result is a valid scenario and
/// `still_fails` says it still fails (the same way: that is the caller's to judge). At most
/// `budget` calls of `still_fails`. `text` itself comes back when it is not TOML or
/// nothing can go.
pub fn shrink(text: &str, budget: usize, mut still_fails: impl FnMut(&str) -> bool) -> String {
    let Ok(mut table) = text.parse::<Table>() else {
        return text.to_string();
    };
    let mut best = text.to_string();
    let mut calls = 0;
    let mut try_it = |candidate: &Table, best: &mut String| -> bool {
        if calls >= budget {
            return false;
        }
        let Ok(t) = toml::to_string(candidate) else {
            return false;
        };
        if crate::parse("shrink", "shrink", &t).is_err() {
            return false;
        }
        calls += 1;
        if still_fails(&t) {
            *best = t;
            return true;
        }
        false
    };
    loop {
        let mut progress = false;
        let n = steps(&table).map_or(0, Vec::len);
        // From the last step back: later steps depend on earlier ones more than the
        // reverse.
        for i in (0..n).rev() {
            let mut candidate = table.clone();
            if let Some(s) = steps_mut(&mut candidate)
                && i < s.len()
            {
                s.remove(i);
            }
            if try_it(&candidate, &mut best) {
                table = candidate;
                progress = true;
            }
        }
        let n = steps(&table).map_or(0, Vec::len);
        for i in 0..n {
            let mut candidate = table.clone();
            let cut = steps_mut(&mut candidate)
                .and_then(|s| s.get_mut(i))
                .and_then(|s| s.get_mut("post"))
                .and_then(Value::as_table_mut)
                .is_some_and(|post| {
                    let more = post.get("count").and_then(Value::as_integer).unwrap_or(1) > 1;
                    if more {
                        post.insert("count".into(), Value::Integer(1));
                        post.remove("batch");
                        post.remove("fault_at");
                    }
                    more
                });
            if cut && try_it(&candidate, &mut best) {
                table = candidate;
                progress = true;
            }
        }
        if !progress {
            return best;
        }
    }
}

fn steps(t: &Table) -> Option<&Vec<Value>> {
    t.get("step").and_then(Value::as_array)
}

fn steps_mut(t: &mut Table) -> Option<&mut Vec<Value>> {
    t.get_mut("step").and_then(Value::as_array_mut)
}
