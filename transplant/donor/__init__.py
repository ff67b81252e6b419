"""Where the donor's facts and bytes come from: live hosts, snapshots, the store (edge)."""
