//! Event pool, operation coordinator with deadlock detection, cross-stream barrier, async event waiter (being built).
