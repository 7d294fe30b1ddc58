//! A bulk submit (`gpuq submit --from FILE`, `SubmitMany`) is all or none:
//! the first job that would be refused refuses the batch. Which job that was
//! is data, not text: the leader's state machine and the API both name it
//! with [`BatchEntryError`], and the CLI turns its index into the line of the
//! user's file without reading it back out of a sentence.

use serde::{Deserialize, Serialize};

/// One job of a bulk submit was refused, so none was queued.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, thiserror::Error)]
#[error("{}", BatchEntryError::message(self.index, &self.why))]
pub struct BatchEntryError {
    /// The refused job's place in the batch, from 0.
    pub index: usize,
    /// Why that job was refused.
    pub why: String,
}

impl BatchEntryError {
    /// How the refusal reads: `job N of the batch (from 1): why; nothing was
    /// submitted`. Earlier clients find the index in this text, so it stays.
    pub fn message(index: usize, why: &impl std::fmt::Display) -> String {
        format!(
            "job {} of the batch (from 1): {why}; nothing was submitted",
            index + 1
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_message_counts_from_one_and_says_nothing_was_submitted() {
        let e = BatchEntryError {
            index: 1,
            why: "no such partition".into(),
        };
        assert_eq!(
            e.to_string(),
            "job 2 of the batch (from 1): no such partition; nothing was submitted"
        );
    }
}
