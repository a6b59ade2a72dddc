"""Audio out: the encoders the API serves, and how good a rendered segment sounds."""
