"""The farm on one machine: the embedded Redis `voxfarm up` starts and the state file
that tells the client commands where the farm listens."""
