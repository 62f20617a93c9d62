"""The ``fleetcron`` command line."""
