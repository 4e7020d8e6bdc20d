//! Sub-communicators: 8 ranks as threads on 2 nodes x 4 split into one communicator per
//! node (the expert-parallel groups of a pipeline stage, say) and one per local index
//! (the pipeline's point-to-point partners); each sums its members' ranks.
//!
//! ```sh
//! cargo run -p halo --example split
//! ```

use halo::ReduceOp;
use halo::local::{self, Emulation};
use halo::topology::{Level, Topology};

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let topology = Topology::preset("nodes:2x4")?;
    let results = local::run(&topology, Emulation::off(), |comm| {
        let me = comm.rank();
        let node = comm.topology().domain(me, Level::Node) as u32;
        let local = comm.topology().local_index(me, Level::Node) as u32;
        // Members ordered by their rank in the parent (key = rank).
        let mut per_node = comm
            .split(Some(node), me as i32)?
            .expect("every rank has a node");
        let mut per_index = comm
            .split(Some(local), me as i32)?
            .expect("every rank has an index");
        let mut sum = [0u64];
        per_node.all_reduce(&[me as u64], &mut sum, ReduceOp::Sum)?;
        let node_sum = sum[0];
        per_index.all_reduce(&[me as u64], &mut sum, ReduceOp::Sum)?;
        Ok((
            per_node.rank(),
            per_node.size(),
            node_sum,
            per_index.size(),
            sum[0],
        ))
    });
    for (rank, r) in results.into_iter().enumerate() {
        let (node_rank, node_size, node_sum, index_size, index_sum) = r?;
        let node = rank / 4;
        let want_node_sum: usize = (node * 4..node * 4 + 4).sum();
        let want_index_sum = (rank % 4) + (rank % 4 + 4);
        if (node_rank, node_size, node_sum, index_size, index_sum)
            != (rank % 4, 4, want_node_sum as u64, 2, want_index_sum as u64)
        {
            return Err(format!("rank {rank}: wrong sub-communicator results").into());
        }
    }
    println!("split: 2 node communicators of 4 and 4 index communicators of 2, sums exact");
    Ok(())
}
