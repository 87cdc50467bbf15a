//! Stream-ordered caching allocator over device memory or the driver's memory pool (being built).
