"""The per-sandbox network policy proxy: a host process holding a TCP listener and a UDP
socket that live in the sandbox's network namespace (see ``namespace.py``). Every TCP
connection the sandbox makes lands on the listener (nft DNAT), every DNS query on the UDP
socket; the proxy decides by the sandbox's NetworkPolicy and connects out from the host's
namespace itself, never to the host, the LAN or link-local ranges.

Everything that arrives is hostile input: parsing is bounded, every handler catches its
own errors, and nothing a sandbox sends can stop the process.
"""
