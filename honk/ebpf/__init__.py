"""The kernel side of admission: per-group connectivity slots the datapath reads."""
