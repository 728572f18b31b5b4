"""Sans-I/O codecs of the proxy protocols honk's outbounds speak.

Nothing in this package touches sockets, the event loop or the clock: each
module turns bytes into bytes (and typed errors), and the outbounds and the
relay engine drive them.
"""
