"""`phalanx doctor`: node checks (phalanx.doctor.checks) and all-reduce bandwidth
(phalanx.doctor.allreduce, run on the ranks of one launch)."""
