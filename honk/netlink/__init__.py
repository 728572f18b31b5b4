"""The router's kernel state honk owns: its nftables table (and, later, policy routing)."""
