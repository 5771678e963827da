"""Who may do what: bearer tokens and their cache, first-start tokens, worker identities,
and the key jobs digest environment values with."""
