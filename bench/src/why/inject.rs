//! What a scenario's loader does per batch besides taking it.

use std::time::Duration;

/// What the loader does per batch.
#[derive(Clone, Copy, Debug)]
pub enum Inject {
    /// Sleep this long per batch (a step that does not need the loader's CPU).
    Sleep(Duration),
    /// Spin this long per batch on the loader's thread.
    Spin(Duration),
}

impl Inject {
    /// Does it once.
    pub fn apply(self) {
        match self {
            Inject::Sleep(d) => std::thread::sleep(d),
            Inject::Spin(d) => {
                let t = std::time::Instant::now();
                while t.elapsed() < d {
                    std::hint::spin_loop();
                }
            }
        }
    }
}
