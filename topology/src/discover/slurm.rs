//! Slurm placement from environment variables, and the Slurm hostlist expander.

use std::collections::BTreeMap;

use super::{DiscoverError, SlurmPlacement, SlurmTopologyLevel};

/// Largest number of host names one node list may expand to; guards against
/// `n[0-4294967295]` exhausting memory.
const MAX_EXPANDED_HOSTS: usize = 1 << 20;

/// The Slurm placement from `env` (`None` when not under Slurm), noted in `sources`.
pub(super) fn placement(
    env: &BTreeMap<String, String>,
    sources: &mut Vec<String>,
) -> Result<Option<SlurmPlacement>, DiscoverError> {
    let slurm = SlurmPlacement::from_env(env)?;
    sources.push(match &slurm {
        Some(s) => format!(
            "env: Slurm{}",
            s.job_id
                .as_ref()
                .map(|j| format!(" job {j}"))
                .unwrap_or_default()
        ),
        None => "env: no SLURM_JOB_ID or SLURM_PROCID (not under Slurm)".to_owned(),
    });
    Ok(slurm)
}

/// Reads the Slurm placement of this process out of an environment snapshot.
///
/// Returns `Ok(None)` when neither `SLURM_JOB_ID` nor `SLURM_PROCID` is set.
pub(super) fn placement_from_env(
    env: &BTreeMap<String, String>,
) -> Result<Option<SlurmPlacement>, DiscoverError> {
    if !env.contains_key("SLURM_JOB_ID") && !env.contains_key("SLURM_PROCID") {
        return Ok(None);
    }
    let text = |name: &str| env.get(name).map(|v| v.trim().to_owned());
    let number =
        |name: &str| -> Result<Option<u32>, DiscoverError> {
            match env.get(name) {
                None => Ok(None),
                Some(value) => value.trim().parse::<u32>().map(Some).map_err(|e| {
                    DiscoverError::SlurmVariable {
                        name: name.to_owned(),
                        value: value.clone(),
                        reason: format!("not a non-negative integer: {e}"),
                    }
                }),
            }
        };

    let job_nodelist = text("SLURM_JOB_NODELIST").or_else(|| text("SLURM_NODELIST"));
    let nodes = match &job_nodelist {
        Some(list) => expand_nodelist(list)?,
        None => Vec::new(),
    };
    let topology_addr = text("SLURM_TOPOLOGY_ADDR");
    let topology_addr_pattern = text("SLURM_TOPOLOGY_ADDR_PATTERN");
    let topology_path = match &topology_addr {
        Some(addr) => parse_topology_addr(addr, topology_addr_pattern.as_deref())?,
        None => Vec::new(),
    };

    Ok(Some(SlurmPlacement {
        job_id: text("SLURM_JOB_ID"),
        job_nodelist,
        nodes,
        job_num_nodes: number("SLURM_JOB_NUM_NODES")?.or(number("SLURM_NNODES")?),
        node_name: text("SLURMD_NODENAME"),
        topology_addr,
        topology_addr_pattern,
        topology_path,
        proc_id: number("SLURM_PROCID")?,
        ntasks: number("SLURM_NTASKS")?,
        local_id: number("SLURM_LOCALID")?,
        node_id: number("SLURM_NODEID")?,
    }))
}

/// Splits `SLURM_TOPOLOGY_ADDR` (`s0.s1.node7`) into levels, naming each with the
/// matching field of `SLURM_TOPOLOGY_ADDR_PATTERN` (`switch.switch.node`) when given.
fn parse_topology_addr(
    addr: &str,
    pattern: Option<&str>,
) -> Result<Vec<SlurmTopologyLevel>, DiscoverError> {
    let names: Vec<&str> = addr.split('.').collect();
    if names.iter().any(|n| n.is_empty()) {
        return Err(DiscoverError::SlurmVariable {
            name: "SLURM_TOPOLOGY_ADDR".to_owned(),
            value: addr.to_owned(),
            reason: "empty component".to_owned(),
        });
    }
    let kinds: Vec<Option<String>> = match pattern {
        Some(pattern) => {
            let kinds: Vec<&str> = pattern.split('.').collect();
            if kinds.len() != names.len() {
                return Err(DiscoverError::SlurmVariable {
                    name: "SLURM_TOPOLOGY_ADDR_PATTERN".to_owned(),
                    value: pattern.to_owned(),
                    reason: format!(
                        "has {} components but SLURM_TOPOLOGY_ADDR `{addr}` has {}",
                        kinds.len(),
                        names.len()
                    ),
                });
            }
            kinds.into_iter().map(|k| Some(k.to_owned())).collect()
        }
        None => vec![None; names.len()],
    };
    Ok(names
        .into_iter()
        .zip(kinds)
        .map(|(name, kind)| SlurmTopologyLevel {
            kind,
            name: name.to_owned(),
        })
        .collect())
}

/// Expands a Slurm host list such as `frontier[00001-00004],login[1,3-4],batch1`
/// into host names, in order.
///
/// Supported: comma-separated items; in each item any number of bracket groups,
/// each a comma-separated list of numbers or inclusive ranges `a-b` (several groups
/// in one item expand as a cartesian product, leftmost slowest). Numbers keep the
/// width of the range's lower bound (`[008-010]` gives `008 009 010`).
///
/// # Errors
///
/// [`DiscoverError::NodeList`] naming the whole list and what is wrong with it:
/// empty list or item, unbalanced or nested brackets, a non-numeric or empty range,
/// a range whose start exceeds its end, or more than 2^20 names.
pub fn expand_nodelist(list: &str) -> Result<Vec<String>, DiscoverError> {
    let bad = |reason: String| DiscoverError::NodeList {
        list: list.to_owned(),
        reason,
    };
    let trimmed = list.trim();
    if trimmed.is_empty() {
        return Err(bad("empty node list".to_owned()));
    }
    let mut hosts = Vec::new();
    for item in split_top_level(trimmed).map_err(&bad)? {
        if item.is_empty() {
            return Err(bad(
                "empty item (two commas in a row, or a trailing comma)".to_owned()
            ));
        }
        expand_item(item, &mut hosts).map_err(|reason| bad(format!("in `{item}`: {reason}")))?;
        if hosts.len() > MAX_EXPANDED_HOSTS {
            return Err(bad(format!(
                "expands to more than {MAX_EXPANDED_HOSTS} names"
            )));
        }
    }
    Ok(hosts)
}

/// Splits at the commas that are outside brackets; checks bracket balance.
fn split_top_level(list: &str) -> Result<Vec<&str>, String> {
    let mut items = Vec::new();
    let mut depth = 0usize;
    let mut start = 0;
    for (i, c) in list.char_indices() {
        match c {
            '[' => {
                if depth > 0 {
                    return Err(format!("nested `[` at byte {i}"));
                }
                depth += 1;
            }
            ']' => {
                if depth == 0 {
                    return Err(format!("`]` without `[` at byte {i}"));
                }
                depth -= 1;
            }
            ',' if depth == 0 => {
                items.push(&list[start..i]);
                start = i + 1;
            }
            c if c.is_whitespace() => return Err(format!("whitespace at byte {i}")),
            _ => {}
        }
    }
    if depth != 0 {
        return Err("`[` without closing `]`".to_owned());
    }
    items.push(&list[start..]);
    Ok(items)
}

/// One piece of an item: literal text, or the numbers of one bracket group.
enum Piece<'a> {
    /// Text copied as is.
    Literal(&'a str),
    /// The alternatives of a bracket group, already formatted.
    Choices(Vec<String>),
}

/// Expands one item (no top-level commas; brackets are balanced) onto `out`.
fn expand_item(item: &str, out: &mut Vec<String>) -> Result<(), String> {
    let mut pieces = Vec::new();
    let mut rest = item;
    while let Some(open) = rest.find('[') {
        if open > 0 {
            pieces.push(Piece::Literal(&rest[..open]));
        }
        let close = rest[open..]
            .find(']')
            .map(|c| open + c)
            .ok_or_else(|| "`[` without closing `]`".to_owned())?;
        pieces.push(Piece::Choices(expand_ranges(&rest[open + 1..close])?));
        rest = &rest[close + 1..];
    }
    if !rest.is_empty() {
        pieces.push(Piece::Literal(rest));
    }

    let mut names = vec![String::new()];
    for piece in &pieces {
        match piece {
            Piece::Literal(text) => names.iter_mut().for_each(|n| n.push_str(text)),
            Piece::Choices(choices) => {
                if names.len().saturating_mul(choices.len()) > MAX_EXPANDED_HOSTS {
                    return Err(format!("expands to more than {MAX_EXPANDED_HOSTS} names"));
                }
                names = names
                    .iter()
                    .flat_map(|prefix| choices.iter().map(move |c| format!("{prefix}{c}")))
                    .collect();
            }
        }
    }
    out.extend(names);
    Ok(())
}

/// Expands the inside of one bracket group: `1,3-5,007-009`.
fn expand_ranges(inner: &str) -> Result<Vec<String>, String> {
    if inner.is_empty() {
        return Err("empty brackets".to_owned());
    }
    let mut out = Vec::new();
    for range in inner.split(',') {
        let (lo, hi) = match range.split_once('-') {
            Some((lo, hi)) => (lo, hi),
            None => (range, range),
        };
        let parse = |s: &str| -> Result<u64, String> {
            if s.is_empty() || !s.bytes().all(|b| b.is_ascii_digit()) {
                return Err(format!("`{range}` is not a number or a range a-b"));
            }
            s.parse::<u64>()
                .map_err(|e| format!("`{range}` is not a number: {e}"))
        };
        let (start, end) = (parse(lo)?, parse(hi)?);
        if start > end {
            return Err(format!("range `{range}` runs backwards"));
        }
        if end - start >= MAX_EXPANDED_HOSTS as u64 {
            return Err(format!(
                "range `{range}` is longer than {MAX_EXPANDED_HOSTS}"
            ));
        }
        let width = lo.len();
        out.extend((start..=end).map(|n| format!("{n:0width$}")));
        if out.len() > MAX_EXPANDED_HOSTS {
            return Err(format!("expands to more than {MAX_EXPANDED_HOSTS} names"));
        }
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ok(list: &str) -> Vec<String> {
        expand_nodelist(list).unwrap_or_else(|e| panic!("{list}: {e}"))
    }

    fn err(list: &str) -> String {
        match expand_nodelist(list) {
            Ok(v) => panic!("{list} expanded to {v:?}"),
            Err(e) => {
                let msg = e.to_string();
                assert!(msg.contains(list), "error `{msg}` does not name `{list}`");
                msg
            }
        }
    }

    #[test]
    fn single_host() {
        assert_eq!(ok("login1"), ["login1"]);
    }

    #[test]
    fn padded_range() {
        assert_eq!(
            ok("frontier[00001-00004]"),
            [
                "frontier00001",
                "frontier00002",
                "frontier00003",
                "frontier00004"
            ]
        );
    }

    #[test]
    fn mixed_list_and_ranges() {
        assert_eq!(
            ok("n[1,3-4,10],gpu07,x[08-10]"),
            ["n1", "n3", "n4", "n10", "gpu07", "x08", "x09", "x10"]
        );
    }

    #[test]
    fn unpadded_range_crossing_width() {
        assert_eq!(ok("n[9-11]"), ["n9", "n10", "n11"]);
    }

    #[test]
    fn suffix_and_several_groups() {
        assert_eq!(
            ok("r[1-2]n[1-2]-ib"),
            ["r1n1-ib", "r1n2-ib", "r2n1-ib", "r2n2-ib"]
        );
    }

    #[test]
    fn single_number_in_brackets() {
        assert_eq!(ok("node[5]"), ["node5"]);
    }

    #[test]
    fn malformed_lists_are_errors_naming_the_list() {
        err("");
        err("n[1-4");
        err("n1-4]");
        err("n[[1-2]]");
        err("n[]");
        err("n[a-b]");
        err("n[4-1]");
        err("n[1-]");
        err("n[1,,2]");
        err("a,,b");
        err("a,");
        err("n[1-2] m");
        err("n[0-99999999]");
    }

    #[test]
    fn backwards_range_reason() {
        assert!(err("n[4-1]").contains("backwards"));
    }
}
