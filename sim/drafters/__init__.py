"""Drafters: what proposes tokens for a verify. One protocol (`base.Drafter`); prompt lookup is the default."""
