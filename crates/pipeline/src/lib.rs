//! Triple buffering, the three-stream async coordinator, pipeline stages, managed context, batch transfer planning (being built).
