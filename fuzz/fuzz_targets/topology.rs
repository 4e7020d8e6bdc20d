//! The topology loader: any text, read as TOML and as JSON, gives a spec or a parse
//! error; any spec gives a topology or an error naming what is wrong, never a panic.
//! A topology that builds writes itself out (TOML and JSON) and reads back the same.

#![no_main]

use halo_topology::{Level, Topology, TopologySpec};
use libfuzzer_sys::fuzz_target;

/// Larger files are valid but only slow the search down.
const MAX_RANKS: usize = 4096;

fn check(spec: TopologySpec) {
    if spec.ranks.len() > MAX_RANKS {
        return;
    }
    let topo = match spec.build() {
        Ok(t) => t,
        Err(e) => {
            assert!(!e.to_string().is_empty(), "an empty error for {spec:?}");
            return;
        }
    };
    let back = topo.to_spec();
    let toml = back.to_toml_string();
    let again = TopologySpec::from_toml_str(&toml)
        .unwrap_or_else(|e| panic!("a built topology's TOML does not read back: {e}\n{toml}"));
    assert_eq!(again, back, "TOML round trip");
    let json = back.to_json_string();
    let again = TopologySpec::from_json_str(&json)
        .unwrap_or_else(|e| panic!("a built topology's JSON does not read back: {e}\n{json}"));
    assert_eq!(again, back, "JSON round trip");
    let rebuilt: Topology = again
        .build()
        .unwrap_or_else(|e| panic!("a built topology's spec does not build again: {e}"));
    assert_eq!(rebuilt.size(), topo.size());
    // The queries the collectives make.
    let n = topo.size();
    let _ = topo.summary();
    let _ = topo.render_tree(4);
    for level in topo.levels().collect::<Vec<Level>>() {
        for d in 0..topo.num_domains(level) {
            assert!(!topo.ranks(level, d).is_empty(), "an empty domain");
            let _ = topo.leader(level, d);
        }
    }
    for r in [0, n / 2, n.saturating_sub(1)]
        .into_iter()
        .filter(|&r| r < n)
    {
        let _ = topo.meet(r as _, (n - 1 - r) as _);
        let _ = topo.nic_of(r as _);
    }
}

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    match TopologySpec::from_toml_str(text) {
        Ok(spec) => check(spec),
        Err(e) => assert!(!e.to_string().is_empty()),
    }
    match TopologySpec::from_json_str(text) {
        Ok(spec) => check(spec),
        Err(e) => assert!(!e.to_string().is_empty()),
    }
});
