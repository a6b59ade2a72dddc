"""Security: API keys and their limits, encryption at rest."""
