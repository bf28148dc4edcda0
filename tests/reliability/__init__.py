"""Probes of reliability and security (issue 16): bad input, faults, load, secrets; loopback only, bounded."""
