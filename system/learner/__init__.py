"""The FSDP2 learner core (Ray-free): model build, log-probs, train step, DCP checkpoints, weight export."""
