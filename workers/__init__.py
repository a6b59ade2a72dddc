"""The worker pools' entry point behind `voxfarm worker`."""
