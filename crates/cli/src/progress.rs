//! The demo's progress: one `indicatif` bar per phase on stderr, drawn only
//! on a terminal (in CI logs and redirected output they stay hidden, and the
//! line each finished phase prints on stdout shows the progress).

use indicatif::{MultiProgress, ProgressBar, ProgressStyle};

pub(crate) struct Progress {
    bars: MultiProgress,
    style: ProgressStyle,
}

impl Progress {
    pub(crate) fn new() -> Self {
        let style = ProgressStyle::with_template(
            "{prefix:>9} [{bar:32.cyan/blue}] {pos:>3}/{len:3} {elapsed:>4} {msg}",
        )
        .unwrap_or_else(|_| ProgressStyle::default_bar())
        .progress_chars("#>.");
        Self {
            bars: MultiProgress::new(),
            style,
        }
    }

    /// A bar for a phase of `len` units.
    pub(crate) fn phase(&self, name: &'static str, len: u64) -> ProgressBar {
        let bar = self.bars.add(ProgressBar::new(len));
        bar.set_style(self.style.clone());
        bar.set_prefix(name);
        bar
    }

    /// A phase ended: remove its bar and print `message` on stdout, on its
    /// own line above any bar still drawn.
    pub(crate) fn phase_done(&self, bar: &ProgressBar, message: &str) {
        bar.finish_and_clear();
        self.bars.suspend(|| println!("{message}"));
    }
}
