//! The fault-injection suite's tests, one binary (each former test file is a module).

mod faults;
mod power_loss;
mod profiles;
