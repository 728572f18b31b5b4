"""The router's kernel state honk owns, and the kernel facts it reads: its nftables table
(``nftables``) and the TPROXY policy routing (``routing``), installed and removed with the
kernel parameters as one interception (``interception``); the socket options of transparent
proxying (``sockopts``); which local process owns a socket, for ``pname`` rules (``owner``)."""
