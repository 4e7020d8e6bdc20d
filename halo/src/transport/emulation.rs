//! Link emulation for the in-process transport: a cluster's shape in one process.
//!
//! netem does not exist on the project's machines, so latency and bandwidth are
//! emulated here, in user space. With emulation on, a message becomes receivable only
//! at its *modelled arrival time*; the receiver's progress checks the clock. The copy
//! itself still happens (at memory speed) once the message has "arrived", so measured
//! times are the model's plus the real cost of moving the bytes.
//!
//! The model is described on [`Emulation`].

use halo_topology::{Level, Topology};
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

/// Seconds a NIC spends per message besides its bytes (LogGP's gap *g*): 0.2 us,
/// i.e. 5 million messages per second per NIC, a host-driven commodity NIC. Used by
/// the cost model and, by default, by the in-process transport's link emulation.
pub const NIC_MESSAGE_GAP: f64 = 0.2e-6;

/// Link emulation for the in-process transport (off by default).
///
/// # The model
///
/// A message of `b` bytes from rank `s` to rank `d` crosses the link class of the level
/// where they meet (`α` latency, `B` bandwidth; [`Topology::link_between`]). Every
/// duration below is multiplied by [`Emulation::scale`].
///
/// - **Inside a node** (`s` and `d` share a node domain): point-to-point links that do
///   not contend, as on a switched fabric (NVSwitch, Infinity Fabric):
///   `arrival = now + α + b / B`.
/// - **Between nodes**: the message leaves through a port of the sender's node and
///   enters through a port of the receiver's node. A port is the rank's NIC
///   ([`Topology::nic_of`], shared by the ranks it serves) or, for ranks without one, a
///   virtual port per node at the outermost level's bandwidth; on topologies without a
///   node level every rank is its own node. A port is full duplex (injection and
///   ejection are separate) and serialises the messages that use it in one direction:
///   each occupies it for `g + b / B_port`, where `g` is the per-message gap
///   ([`Emulation::nic_message_gap`], LogGP's *g*: what a NIC spends per message
///   whatever its size). So
///   ```text
///   t_inj   = max(now, tx_free[src port]);           tx_free = t_inj + g + b / B_src
///   t_ej    = max(t_inj + α, rx_free[dst port]);      rx_free = t_ej  + g + b / B_dst
///   arrival = max(t_ej + g + b / B_dst,  t_inj + α + b / B)
///   ```
///   Many small messages that leave a node thus cost `count x g` on its NIC, as they do
///   on a cluster, and many large ones share the NIC's bandwidth. Ports are reserved in
///   the order messages are posted (FIFO), which is conservative.
/// - Self messages and local copies are not emulated (they are memory copies).
///
/// Not modelled: taper of outer levels (left to the simulator), contention inside a
/// node, and the real copy's own cost, which comes on top. The `b / B` floor of the
/// meeting level is one the simulator does not have; the two agree while no outer
/// level is slower than the NICs, as in every preset (docs/SIMULATION.md, "The system
/// level's bandwidth").
///
/// A receiver waiting for a modelled arrival sleeps until it (sleeps overshoot by the
/// kernel's timer slack, tens of microseconds) or, when it is less than 100 us away,
/// yields the processor in a loop; so measured times are never below the model's, and
/// waiting ranks leave the cores to the others.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Emulation {
    /// Whether messages are delayed to their modelled arrival time.
    pub enabled: bool,
    /// Every modelled duration is multiplied by this (1.0 = the topology's figures;
    /// 100.0 makes a 5 us latency 500 us, which stands out of the noise of a busy
    /// machine).
    pub scale: f64,
    /// Seconds a NIC spends per message besides the bytes (LogGP's gap *g*); default
    /// [`NIC_MESSAGE_GAP`].
    pub nic_message_gap: f64,
}

impl Default for Emulation {
    fn default() -> Self {
        Emulation::off()
    }
}

impl Emulation {
    /// No emulation: messages are receivable as soon as they are posted.
    pub const fn off() -> Self {
        Emulation {
            enabled: false,
            scale: 1.0,
            nic_message_gap: NIC_MESSAGE_GAP,
        }
    }

    /// Emulation with the topology's figures.
    pub const fn on() -> Self {
        Emulation {
            enabled: true,
            scale: 1.0,
            nic_message_gap: NIC_MESSAGE_GAP,
        }
    }

    /// The same emulation with every modelled duration multiplied by `scale`.
    pub const fn scaled(self, scale: f64) -> Self {
        Emulation { scale, ..self }
    }

    pub(crate) fn check(&self) -> Result<(), String> {
        if !(self.scale.is_finite() && self.scale >= 0.0) {
            return Err(format!(
                "emulation scale must be a finite number >= 0, not {}",
                self.scale
            ));
        }
        if !(self.nic_message_gap.is_finite() && self.nic_message_gap >= 0.0) {
            return Err(format!(
                "emulation NIC message gap must be a finite number of seconds >= 0, not {}",
                self.nic_message_gap
            ));
        }
        Ok(())
    }
}

/// One direction-pair of a port: when it is next free, in nanoseconds since the
/// cluster's epoch.
#[derive(Debug)]
struct Port {
    bandwidth: f64,
    tx_free: AtomicU64,
    rx_free: AtomicU64,
}

impl Port {
    /// Reserves `busy` ns on one direction from `earliest` on; returns the start.
    fn reserve(free: &AtomicU64, earliest: u64, busy: u64) -> u64 {
        let mut start = earliest;
        // `fetch_update` retries on contention; the closure is pure.
        let _ = free.fetch_update(Ordering::AcqRel, Ordering::Acquire, |f| {
            start = f.max(earliest);
            Some(start.saturating_add(busy))
        });
        start
    }
}

/// The link model of one cluster.
#[derive(Debug)]
pub(crate) struct LinkModel {
    scale: f64,
    gap: f64,
    /// rank -> node id (the rank itself without a node level).
    node_of: Vec<u32>,
    /// rank -> port for traffic that leaves its node.
    port_of: Vec<u32>,
    ports: Vec<Port>,
}

fn ns(seconds: f64) -> u64 {
    // Saturating float-to-int conversion; negative values cannot occur.
    (seconds * 1e9).round() as u64
}

impl LinkModel {
    pub(crate) fn new(topology: &Topology, emulation: &Emulation) -> Self {
        let n = topology.size();
        let has_node = topology.has_level(Level::Node);
        let node_of: Vec<u32> = (0..n)
            .map(|r| {
                if has_node {
                    topology.domain(r, Level::Node) as u32
                } else {
                    r as u32
                }
            })
            .collect();
        let mut ports: Vec<Port> = topology
            .nics()
            .iter()
            .map(|nic| Port {
                bandwidth: nic.bandwidth,
                tx_free: AtomicU64::new(0),
                rx_free: AtomicU64::new(0),
            })
            .collect();
        let outer = topology.link(Level::System).bandwidth;
        let mut virtual_port: std::collections::HashMap<u32, u32> =
            std::collections::HashMap::new();
        let port_of = (0..n)
            .map(|r| match topology.nic_of(r) {
                Some(nic) => topology
                    .nics()
                    .iter()
                    .position(|x| std::ptr::eq(x, nic))
                    .expect("the NIC is one of the topology's") as u32,
                None => *virtual_port.entry(node_of[r]).or_insert_with(|| {
                    ports.push(Port {
                        bandwidth: outer,
                        tx_free: AtomicU64::new(0),
                        rx_free: AtomicU64::new(0),
                    });
                    (ports.len() - 1) as u32
                }),
            })
            .collect();
        LinkModel {
            scale: emulation.scale,
            gap: emulation.nic_message_gap,
            node_of,
            port_of,
            ports,
        }
    }

    /// The modelled arrival time (ns since the epoch) of `bytes` from `src` to `dst`
    /// posted at `now`; reserves the ports it uses.
    pub(crate) fn arrival(
        &self,
        topology: &Topology,
        src: usize,
        dst: usize,
        bytes: usize,
        now: u64,
    ) -> u64 {
        if src == dst {
            return now;
        }
        let link = topology.link_between(src, dst);
        let b = bytes as f64;
        let s = self.scale;
        let alpha = ns(s * link.latency);
        let wire = ns(s * b / link.bandwidth);
        if self.node_of[src] == self.node_of[dst] {
            return now.saturating_add(alpha).saturating_add(wire);
        }
        let tx = &self.ports[self.port_of[src] as usize];
        let rx = &self.ports[self.port_of[dst] as usize];
        let busy_tx = ns(s * (self.gap + b / tx.bandwidth));
        let busy_rx = ns(s * (self.gap + b / rx.bandwidth));
        let t_inj = Port::reserve(&tx.tx_free, now, busy_tx);
        let t_ej = Port::reserve(&rx.rx_free, t_inj.saturating_add(alpha), busy_rx);
        t_ej.saturating_add(busy_rx)
            .max(t_inj.saturating_add(alpha).saturating_add(wire))
    }

    /// The modelled time of one message on an idle network.
    pub(crate) fn idle_time(
        &self,
        topology: &Topology,
        src: usize,
        dst: usize,
        bytes: usize,
    ) -> Duration {
        if src == dst {
            return Duration::ZERO;
        }
        let link = topology.link_between(src, dst);
        let b = bytes as f64;
        let s = self.scale;
        let t = if self.node_of[src] == self.node_of[dst] {
            s * (link.latency + b / link.bandwidth)
        } else {
            // Idle ports: t_inj = 0 and t_ej = α, then as in `arrival`.
            let rx = &self.ports[self.port_of[dst] as usize];
            s * (link.latency + (self.gap + b / rx.bandwidth).max(b / link.bandwidth))
        };
        Duration::from_secs_f64(t)
    }
}
