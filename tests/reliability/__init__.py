"""Probes of reliability and security (issue 16): bad input, faults, load, secrets.

Loopback only, bounded, and independent of machine load.
"""
