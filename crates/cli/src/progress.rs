//! A progress bar on stderr, hand-written.
//!
//! On a terminal the bar is redrawn in place with `\r`; elsewhere (CI logs,
//! redirected output) redrawing would fill the log with fragments, so only
//! the line each finished phase prints (on stdout) shows the progress.

use std::io::{IsTerminal, Write};

const WIDTH: usize = 32;

pub(crate) struct Progress {
    total: usize,
    done: usize,
    tty: bool,
}

impl Progress {
    pub(crate) fn new(total: usize) -> Self {
        Self {
            total: total.max(1),
            done: 0,
            tty: std::io::stderr().is_terminal(),
        }
    }

    /// One unit of work finished, while doing `what`.
    pub(crate) fn advance(&mut self, what: &str) {
        self.done = (self.done + 1).min(self.total);
        if self.tty {
            let filled = self.done * WIDTH / self.total;
            let mut err = std::io::stderr().lock();
            let _ = write!(
                err,
                "\r[{}{}] {:3}% {what:<40}",
                "#".repeat(filled),
                ".".repeat(WIDTH - filled),
                self.done * 100 / self.total
            );
            let _ = err.flush();
        }
    }

    /// A phase ended: say so on stdout, on its own line (clearing the bar first).
    pub(crate) fn phase_done(&mut self, message: &str) {
        self.clear();
        println!("{message}");
    }

    /// Remove the bar from the terminal.
    pub(crate) fn clear(&mut self) {
        if self.tty {
            let _ = write!(std::io::stderr().lock(), "\r{}\r", " ".repeat(WIDTH + 48));
        }
    }
}

impl Drop for Progress {
    fn drop(&mut self) {
        self.clear();
    }
}
