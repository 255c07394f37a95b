"""The service runtime every service shares (SPEC §4, §12, I3, I7): the process shell with
/livez, /readyz and /metrics (`service`), HTTP bounds, metrics and database gauges, the Temporal
connection and its 64 KB payload guard, the Wake kick between services, the release and build id,
the guard on outbound HTTP, and the wiring of pool and Temporal."""
