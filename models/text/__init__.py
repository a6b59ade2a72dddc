"""The text frontend: normalisation (English, Chinese), segments, lexicons, SSML,
words in time and captions."""
