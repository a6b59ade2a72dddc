"""The voice canary: the rule that promotes or rolls back a candidate version
(`rule`, pure) and the versions, figures and decisions kept in Redis (`store`)."""
