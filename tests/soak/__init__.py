"""The soak of issue 30 (``make soak``): mixed load on the real services, one restarted every
two minutes, then every run checked and nothing left behind."""
