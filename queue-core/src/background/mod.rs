//! Background loops that run beside the jobs, shared by the [`Worker`] and
//! the [`Watchdog`]: the promoter (due delayed jobs → main) and the periodic
//! job scheduler. Each loop stops when its `stop` flag turns true.
//!
//! [`Worker`]: crate::Worker
//! [`Watchdog`]: crate::Watchdog

pub(crate) mod promoter;
pub(crate) mod scheduler;
