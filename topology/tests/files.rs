//! Topology files: round trips of every preset through TOML, JSON and files on disk, and
//! the precise error each kind of malformed file gets.

use halo_topology::{Topology, TopologyError, TopologySpec};
use std::path::PathBuf;

const PRESETS: [&str; 8] = [
    "flat:1",
    "flat:7",
    "nodes:4x4",
    "nodes:3x5,ranks=13",
    "frontier:16",
    "frontier:130",
    "dgx-h100:2",
    "frontier:5,ranks=37",
];

/// A fresh directory for one test under cargo's scratch space.
fn scratch(test: &str) -> PathBuf {
    let dir = PathBuf::from(env!("CARGO_TARGET_TMPDIR"))
        .join("halo-topology-files")
        .join(test);
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

fn data(name: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("tests/data")
        .join(name)
}

// ---------------------------------------------------------------------------------------
// Round trips.

#[test]
fn presets_round_trip_through_toml() {
    for p in PRESETS {
        let t = Topology::preset(p).unwrap();
        let text = t.to_spec().to_toml_string();
        assert!(text.ends_with('\n'), "{p}");
        let spec = TopologySpec::from_toml_str(&text).unwrap_or_else(|e| panic!("{p}: {e}"));
        assert_eq!(spec, t.to_spec(), "{p}");
        assert_eq!(spec.build().unwrap(), t, "{p}");
    }
}

#[test]
fn presets_round_trip_through_json() {
    for p in PRESETS {
        let t = Topology::preset(p).unwrap();
        let text = t.to_spec().to_json_string();
        let spec = TopologySpec::from_json_str(&text).unwrap_or_else(|e| panic!("{p}: {e}"));
        assert_eq!(spec, t.to_spec(), "{p}");
        assert_eq!(spec.build().unwrap(), t, "{p}");
    }
}

#[test]
fn presets_round_trip_through_files() {
    let dir = scratch("round_trip");
    for p in PRESETS {
        let t = Topology::preset(p).unwrap();
        let stem = p.replace([':', ','], "_");
        let toml = dir.join(format!("{stem}.toml"));
        let json = dir.join(format!("{stem}.json"));
        std::fs::write(&toml, t.to_spec().to_toml_string()).unwrap();
        std::fs::write(&json, t.to_spec().to_json_string()).unwrap();
        assert_eq!(
            Topology::load(&toml).unwrap(),
            t,
            "{p} via {}",
            toml.display()
        );
        assert_eq!(
            Topology::load(&json).unwrap(),
            t,
            "{p} via {}",
            json.display()
        );
    }
}

#[test]
fn preset_spec_is_what_preset_builds() {
    for p in PRESETS {
        assert_eq!(
            halo_topology::preset_spec(p).unwrap().build().unwrap(),
            Topology::preset(p).unwrap()
        );
    }
}

#[test]
fn json_detected_by_content_whatever_the_name() {
    let dir = scratch("json_by_content");
    let t = Topology::preset("nodes:2x3").unwrap();
    let path = dir.join("topology.txt");
    std::fs::write(&path, t.to_spec().to_json_string()).unwrap();
    assert_eq!(Topology::load(&path).unwrap(), t);
}

#[test]
fn hand_written_file_round_trips_to_dense_labels() {
    let t = Topology::load(data("hand.toml")).unwrap();
    let spec = t.to_spec();
    // Written back with dense labels and in rank order.
    assert_eq!(
        spec.ranks.iter().map(|r| r.rank).collect::<Vec<_>>(),
        (0..7).collect::<Vec<i64>>()
    );
    assert_eq!(spec.ranks[0].domains["node"], 2);
    assert_eq!(spec.ranks[0].domains["switch"], 0);
    assert_eq!(spec.ranks[1].domains["node"], 0);
    assert_eq!(spec.ranks[1].host.as_deref(), Some("a"));
    let back = TopologySpec::from_toml_str(&spec.to_toml_string())
        .unwrap()
        .build()
        .unwrap();
    assert_eq!(back, t);
    let back = TopologySpec::from_json_str(&spec.to_json_string())
        .unwrap()
        .build()
        .unwrap();
    assert_eq!(back, t);
}

// ---------------------------------------------------------------------------------------
// Malformed files.

const LINKS: &str = "[links]
device = { bandwidth = 1.0e10, latency = 0.0 }
node = { bandwidth = 5.0e9, latency = 1.0e-6 }
system = { bandwidth = 1.0e9, latency = 5.0e-6 }
";

/// `[[ranks]]` entries, each `(rank, extra lines)`.
fn ranks(entries: &[(i64, &str)]) -> String {
    entries
        .iter()
        .map(|(r, extra)| format!("\n[[ranks]]\nrank = {r}\n{extra}\n"))
        .collect()
}

/// Four ranks on two nodes: {0, 1} and {2, 3}.
fn four() -> String {
    ranks(&[
        (0, "node = 0"),
        (1, "node = 0"),
        (2, "node = 1"),
        (3, "node = 1"),
    ])
}

/// Parses `text`, builds it, and returns the `Invalid` error's field and reason.
fn invalid(text: &str) -> (String, String) {
    let spec = TopologySpec::from_toml_str(text).unwrap_or_else(|e| panic!("{e}\n{text}"));
    match spec.build() {
        Err(TopologyError::Invalid { field, reason }) => (field, reason),
        Err(other) => panic!("expected Invalid, got {other:?}\n{text}"),
        Ok(_) => panic!("expected Invalid, the topology built\n{text}"),
    }
}

/// Asserts the `Invalid` error names `field` and its reason holds every word of `words`.
#[track_caller]
fn expect_invalid(text: &str, field: &str, words: &[&str]) {
    let (f, reason) = invalid(text);
    assert_eq!(f, field, "reason: {reason}\n{text}");
    for w in words {
        assert!(reason.contains(w), "reason {reason:?} lacks {w:?}");
    }
}

#[track_caller]
fn expect_parse(text: &str, words: &[&str]) -> String {
    match TopologySpec::from_toml_str(text) {
        Err(TopologyError::Parse { what, reason }) => {
            assert_eq!(what, "TOML");
            for w in words {
                assert!(reason.contains(w), "reason {reason:?} lacks {w:?}");
            }
            reason
        }
        Err(other) => panic!("expected Parse, got {other:?}"),
        Ok(_) => panic!("expected Parse, it parsed\n{text}"),
    }
}

fn with_links(links: &str, rest: &str) -> String {
    format!("{links}{rest}")
}

#[test]
fn the_base_file_is_valid() {
    let t = TopologySpec::from_toml_str(&with_links(LINKS, &four()))
        .unwrap()
        .build()
        .unwrap();
    assert_eq!(t.size(), 4);
}

#[test]
fn duplicate_rank() {
    let text = with_links(
        LINKS,
        &ranks(&[
            (0, "node = 0"),
            (1, "node = 0"),
            (1, "node = 1"),
            (2, "node = 1"),
        ]),
    );
    expect_invalid(&text, "ranks[2].rank", &["duplicate rank 1", "ranks[1]"]);
}

#[test]
fn rank_missing_in_a_gap() {
    // Three entries 0, 1, 3: rank 2 is missing (rather than "3 out of range").
    let text = with_links(
        LINKS,
        &ranks(&[(0, "node = 0"), (1, "node = 0"), (3, "node = 1")]),
    );
    expect_invalid(&text, "ranks", &["rank 2 missing", "ranks[2] gives rank 3"]);
}

#[test]
fn rank_missing_at_the_start() {
    let text = with_links(
        LINKS,
        &ranks(&[(1, "node = 0"), (2, "node = 0"), (3, "node = 1")]),
    );
    expect_invalid(&text, "ranks", &["rank 0 missing", "0..2"]);
}

#[test]
fn negative_rank() {
    let text = with_links(LINKS, &ranks(&[(0, "node = 0"), (-1, "node = 0")]));
    expect_invalid(&text, "ranks[1].rank", &["rank -1 is negative"]);
}

#[test]
fn negative_bandwidth() {
    let links = LINKS.replace("node = { bandwidth = 5.0e9", "node = { bandwidth = -5.0e9");
    expect_invalid(
        &with_links(&links, &four()),
        "links.node.bandwidth",
        &["positive", "-5000000000"],
    );
}

#[test]
fn zero_bandwidth() {
    let links = LINKS.replace("system = { bandwidth = 1.0e9", "system = { bandwidth = 0");
    expect_invalid(
        &with_links(&links, &four()),
        "links.system.bandwidth",
        &["positive", "got 0"],
    );
}

#[test]
fn infinite_bandwidth() {
    let links = LINKS.replace("system = { bandwidth = 1.0e9", "system = { bandwidth = inf");
    expect_invalid(
        &with_links(&links, &four()),
        "links.system.bandwidth",
        &["finite", "got inf"],
    );
}

#[test]
fn negative_latency() {
    let links = LINKS.replace("latency = 1.0e-6", "latency = -1.0e-6");
    expect_invalid(
        &with_links(&links, &four()),
        "links.node.latency",
        &["non-negative", "-0.000001"],
    );
}

#[test]
fn nan_latency() {
    // TOML spells NaN `nan` (JSON cannot write it at all).
    let links = LINKS.replace("latency = 1.0e-6", "latency = nan");
    expect_invalid(
        &with_links(&links, &four()),
        "links.node.latency",
        &["finite", "NaN"],
    );
}

#[test]
fn taper_below_one() {
    let links = LINKS.replace("latency = 5.0e-6 }", "latency = 5.0e-6, taper = 0.5 }");
    expect_invalid(
        &with_links(&links, &four()),
        "links.system.taper",
        &[">= 1", "0.5"],
    );
}

#[test]
fn unknown_level_in_links() {
    let links = format!("{LINKS}rack = {{ bandwidth = 1.0e9, latency = 1.0e-6 }}\n");
    expect_invalid(
        &with_links(&links, &four()),
        "links.rack",
        &["unknown level 'rack'", "switch"],
    );
}

#[test]
fn unknown_level_in_a_rank() {
    let text = with_links(LINKS, &ranks(&[(0, "node = 0"), (1, "node = 0\nrack = 2")]));
    expect_invalid(&text, "ranks[1].rack", &["unknown level 'rack'"]);
}

#[test]
fn rank_names_a_level_without_link_class() {
    let text = with_links(
        LINKS,
        &ranks(&[(0, "node = 0\nswitch = 0"), (1, "node = 0")]),
    );
    expect_invalid(
        &text,
        "ranks[0].switch",
        &["'switch' has no link class in [links]"],
    );
}

#[test]
fn rank_lacking_a_present_level() {
    let text = with_links(LINKS, &ranks(&[(0, "node = 0"), (1, "")]));
    expect_invalid(&text, "ranks[1]", &["rank 1 gives no 'node'"]);
}

#[test]
fn device_or_system_given_per_rank() {
    let text = with_links(
        LINKS,
        &ranks(&[(0, "node = 0\ndevice = 0"), (1, "node = 0")]),
    );
    expect_invalid(&text, "ranks[0].device", &["implicit"]);
    let text = with_links(
        LINKS,
        &ranks(&[(0, "node = 0"), (1, "node = 0\nsystem = 0")]),
    );
    expect_invalid(&text, "ranks[1].system", &["implicit"]);
}

#[test]
fn negative_domain_label() {
    let text = with_links(LINKS, &ranks(&[(0, "node = 0"), (1, "node = -4")]));
    expect_invalid(&text, "ranks[1].node", &["non-negative", "-4"]);
}

#[test]
fn empty_host() {
    let text = with_links(
        LINKS,
        &ranks(&[(0, "node = 0\nhost = \"\""), (1, "node = 0")]),
    );
    expect_invalid(&text, "ranks[0].host", &["empty host"]);
}

fn nic(name: &str, ranks: &str) -> String {
    format!("\n[[nics]]\nname = \"{name}\"\nbandwidth = 1.0e9\nranks = {ranks}\n")
}

#[test]
fn nic_serving_no_device() {
    let text = with_links(LINKS, &(four() + &nic("eth0", "[]")));
    expect_invalid(&text, "nics[0].ranks", &["'eth0' serves no device"]);
}

#[test]
fn nic_serving_a_nonexistent_rank() {
    let text = with_links(
        LINKS,
        &(four() + &nic("eth0", "[0, 1]") + &nic("eth1", "[2, 9]")),
    );
    expect_invalid(
        &text,
        "nics[1].ranks",
        &["rank 9, which does not exist", "0..3"],
    );
    let text = with_links(LINKS, &(four() + &nic("eth0", "[-1]")));
    expect_invalid(&text, "nics[0].ranks", &["rank -1, which does not exist"]);
}

#[test]
fn rank_served_by_two_nics() {
    let text = with_links(
        LINKS,
        &(four() + &nic("eth0", "[0, 1]") + &nic("eth1", "[1]")),
    );
    expect_invalid(
        &text,
        "nics[1].ranks",
        &["rank 1 is served by both", "'eth0'", "'eth1'"],
    );
}

#[test]
fn nic_listing_a_rank_twice() {
    let text = with_links(LINKS, &(four() + &nic("eth0", "[0, 1, 0]")));
    expect_invalid(&text, "nics[0].ranks", &["'eth0' lists rank 0 twice"]);
}

#[test]
fn nic_spanning_two_nodes() {
    let text = with_links(
        LINKS,
        &(four() + &nic("eth0", "[0]") + &nic("eth1", "[3, 1]")),
    );
    // Sorted, eth1 serves 1 (node 0) and 3 (node 1).
    expect_invalid(
        &text,
        "nics[1].ranks",
        &["'eth1' serves ranks 1 and 3", "different nodes"],
    );
}

#[test]
fn nic_bad_figures() {
    let text = with_links(
        LINKS,
        &(four() + "\n[[nics]]\nname = \"eth0\"\nbandwidth = -1.0\nranks = [0]\n"),
    );
    expect_invalid(&text, "nics[0].bandwidth", &["positive"]);
    let text = with_links(
        LINKS,
        &(four() + "\n[[nics]]\nname = \"eth0\"\nbandwidth = 1.0\nlatency = -2.0\nranks = [0]\n"),
    );
    expect_invalid(&text, "nics[0].latency", &["non-negative"]);
    let text = with_links(LINKS, &(four() + &nic("", "[0]")));
    expect_invalid(&text, "nics[0].name", &["empty NIC name"]);
}

const SWITCHED: &str = "[links]
device = { bandwidth = 1.0e10, latency = 0.0 }
node = { bandwidth = 5.0e9, latency = 1.0e-6 }
switch = { bandwidth = 2.0e9, latency = 2.0e-6 }
system = { bandwidth = 1.0e9, latency = 5.0e-6 }
";

#[test]
fn node_split_across_two_switches() {
    // Rank 3 is listed first; it shares node 1 with rank 2 but names another switch.
    let text = with_links(
        SWITCHED,
        &ranks(&[
            (3, "node = 1\nswitch = 1"),
            (0, "node = 0\nswitch = 0"),
            (1, "node = 0\nswitch = 0"),
            (2, "node = 1\nswitch = 0"),
        ]),
    );
    expect_invalid(
        &text,
        "ranks[0].switch",
        &[
            "rank 3 is in the same node as rank 2 but in a different switch",
            "a node must lie inside one switch",
        ],
    );
}

#[test]
fn package_split_across_two_nodes() {
    let links = format!("{LINKS}package = {{ bandwidth = 2.0e10, latency = 1.0e-7 }}\n");
    let text = with_links(
        &links,
        &ranks(&[
            (0, "node = 0\npackage = 0"),
            (1, "node = 1\npackage = 0"),
            (2, "node = 1\npackage = 1"),
        ]),
    );
    expect_invalid(
        &text,
        "ranks[1].node",
        &["a package must lie inside one node"],
    );
}

#[test]
fn two_nodes_with_the_same_host() {
    let text = with_links(
        LINKS,
        &ranks(&[
            (0, "node = 0\nhost = \"a\""),
            (2, "node = 1\nhost = \"a\""),
            (1, "node = 0\nhost = \"a\""),
            (3, "node = 1\nhost = \"a\""),
        ]),
    );
    expect_invalid(
        &text,
        "ranks[1].host",
        &[
            "host 'a' names two nodes",
            "node 0 (rank 0)",
            "node 1 (rank 2)",
        ],
    );
}

#[test]
fn one_node_with_two_hosts() {
    let text = with_links(
        LINKS,
        &ranks(&[
            (0, "node = 0\nhost = \"a\""),
            (1, "node = 0\nhost = \"b\""),
            (2, "node = 1\nhost = \"c\""),
        ]),
    );
    expect_invalid(
        &text,
        "ranks[1].host",
        &[
            "ranks 0 and 1 are on one node",
            "different hosts ('a' and 'b')",
        ],
    );
    // A host on some ranks of a node but not on the others is as inconsistent.
    let text = with_links(
        LINKS,
        &ranks(&[(0, "node = 0\nhost = \"a\""), (1, "node = 0")]),
    );
    expect_invalid(&text, "ranks[1].host", &["different hosts ('a' and none)"]);
}

#[test]
fn missing_device_link() {
    let links = LINKS.replace("device = { bandwidth = 1.0e10, latency = 0.0 }\n", "");
    expect_invalid(
        &with_links(&links, &four()),
        "links.device",
        &["missing", "device link class"],
    );
}

#[test]
fn missing_system_link() {
    let links = LINKS.replace("system = { bandwidth = 1.0e9, latency = 5.0e-6 }\n", "");
    expect_invalid(
        &with_links(&links, &four()),
        "links.system",
        &["missing", "system link class"],
    );
}

#[test]
fn no_ranks() {
    let text = format!("ranks = []\n{LINKS}");
    expect_invalid(&text, "ranks", &["no ranks"]);
}

#[test]
fn toml_syntax_error_names_the_line() {
    let text = format!("{LINKS}\n[[ranks]]\nrank = 0\nnode = = 0\n");
    expect_parse(&text, &["line 8"]);
}

#[test]
fn unknown_fields_are_rejected() {
    expect_parse(
        &format!("nodes = 3\n{LINKS}{}", four()),
        &["unknown field `nodes`"],
    );
    // A misspelt taper is not silently ignored.
    let links = LINKS.replace("latency = 5.0e-6 }", "latency = 5.0e-6, tapr = 2.0 }");
    expect_parse(&with_links(&links, &four()), &["unknown field `tapr`"]);
    let text = with_links(
        LINKS,
        &(four() + "\n[[nics]]\nname = \"e\"\nbandwidth = 1.0\nranks = [0]\nport = 1\n"),
    );
    expect_parse(&text, &["unknown field `port`"]);
}

#[test]
fn missing_required_fields() {
    expect_parse(LINKS, &["missing field `ranks`"]);
    expect_parse(&four(), &["missing field `links`"]);
    expect_parse(
        &with_links(LINKS, "\n[[ranks]]\nnode = 0\n"),
        &["missing field `rank`"],
    );
    expect_parse(
        &with_links(
            LINKS,
            "\n[[ranks]]\nrank = 0\nnode = 0\n\n[[nics]]\nname = \"e\"\nranks = [0]\n",
        ),
        &["missing field `bandwidth`"],
    );
}

#[test]
fn missing_file_is_io() {
    let path = scratch("missing").join("nope.toml");
    match Topology::load(&path) {
        Err(TopologyError::Io { path: p, source }) => {
            assert!(p.ends_with("nope.toml"), "{p}");
            assert_eq!(source.kind(), std::io::ErrorKind::NotFound);
        }
        other => panic!("expected Io, got {other:?}"),
    }
}

#[test]
fn devices_and_huge_files_are_refused_before_reading() {
    match Topology::load("/dev/zero") {
        Err(e @ TopologyError::NotAFile { .. }) => assert_eq!(
            e.to_string(),
            "topology file /dev/zero is not a regular file: it is a character device"
        ),
        other => panic!("expected NotAFile, got {other:?}"),
    }
    let dir = scratch("huge");
    match Topology::load(&dir) {
        Err(TopologyError::NotAFile { kind, .. }) => assert_eq!(kind, "a directory"),
        other => panic!("expected NotAFile, got {other:?}"),
    }
    // Sparse: no real bytes on disk.
    let path = dir.join("huge.toml");
    let f = std::fs::File::create(&path).unwrap();
    f.set_len(1 << 40).unwrap();
    match Topology::load(&path) {
        Err(e @ TopologyError::TooLarge { .. }) => {
            let msg = e.to_string();
            assert!(msg.contains("huge.toml"), "{msg}");
            assert!(
                msg.ends_with("is larger than the limit of 67108864 bytes (64 MiB)"),
                "{msg}"
            );
        }
        other => panic!("expected TooLarge, got {other:?}"),
    }
    // At the limit the file is read (all zero bytes: not TOML).
    f.set_len(halo_topology::MAX_FILE_BYTES).unwrap();
    assert!(
        matches!(Topology::load(&path), Err(TopologyError::Parse { .. })),
        "a file of exactly the limit is read"
    );
    f.set_len(halo_topology::MAX_FILE_BYTES + 1).unwrap();
    assert!(matches!(
        Topology::load(&path),
        Err(TopologyError::TooLarge { .. })
    ));
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn parse_errors_from_files_name_the_file() {
    let dir = scratch("parse_file");
    let toml = dir.join("bad.toml");
    std::fs::write(&toml, "[links\n").unwrap();
    match Topology::load(&toml) {
        Err(TopologyError::Parse { what, reason }) => {
            assert!(what.ends_with("bad.toml"), "{what}");
            assert!(reason.contains("line 1"), "{reason}");
        }
        other => panic!("expected Parse, got {other:?}"),
    }
    let json = dir.join("bad.json");
    std::fs::write(&json, "{\n  \"links\": {},\n  \"ranks\": [ }\n").unwrap();
    match Topology::load(&json) {
        Err(TopologyError::Parse { what, reason }) => {
            assert!(what.ends_with("bad.json"), "{what}");
            assert!(reason.contains("line 3"), "{reason}");
        }
        other => panic!("expected Parse, got {other:?}"),
    }
}

#[test]
fn invalid_file_error_message() {
    let dir = scratch("invalid_file");
    let path = dir.join("gap.toml");
    std::fs::write(
        &path,
        with_links(
            LINKS,
            &ranks(&[(0, "node = 0"), (1, "node = 0"), (3, "node = 1")]),
        ),
    )
    .unwrap();
    let err = Topology::load(&path).unwrap_err();
    assert_eq!(
        err.to_string(),
        "invalid topology: ranks: rank 2 missing: 3 entries must give ranks 0..2 once each; \
         ranks[2] gives rank 3, beyond the last rank 2"
    );
}
