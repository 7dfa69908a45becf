"""`peerd orchestrate`: plan, dispatch, verify and integrate work packets across coders and machines."""
