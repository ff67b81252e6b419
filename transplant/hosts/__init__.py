"""The host edge: commands on hosts, host scripts run and read, rsync."""
