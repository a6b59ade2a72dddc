"""What the farm keeps in Redis: jobs, books, the feature cache, artifacts on disk,
listener leases, every Redis key, the states a job and a book move through, and
the Redis clients."""
