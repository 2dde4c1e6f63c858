"""`phalanx top RUN_DIR|JOB_ID`: a live terminal view of a run, read from its run directory."""
