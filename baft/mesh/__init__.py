"""Where a rank stands in the job: its data-parallel replica and shard (:mod:`~baft.mesh.topology`), the few
collectives the strategies need (:mod:`~baft.mesh.collective`), and the state every tensor-parallel rank
holds alike (:mod:`~baft.mesh.tpshared`)."""
