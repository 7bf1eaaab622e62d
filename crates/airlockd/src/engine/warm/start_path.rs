//! How a run's sandbox started (cold, warm, zygote), as its record and metrics name it. Apart
//! from the pools: the record and the metrics read it for every run, warm starts or not.

use airlock::warm::WARM_DETAIL;
use serde::{Deserialize, Serialize};
use utoipa::ToSchema;

use crate::store::{Document, Ending};

/// How a run's sandbox started (see `docs/warm.md`).
#[derive(Serialize, Deserialize, ToSchema, Debug, Clone, Copy, PartialEq, Eq)]
#[serde(rename_all = "snake_case")]
pub enum StartPath {
    Cold,
    Warm,
    Zygote,
}

impl StartPath {
    pub fn name(self) -> &'static str {
        match self {
            StartPath::Cold => "cold",
            StartPath::Warm => "warm",
            StartPath::Zygote => "zygote",
        }
    }

    /// The path a run's stored result records, if any.
    pub fn of_result(result: &Document) -> Option<StartPath> {
        /// The one field read of the result, `start` (a pass over its text, no tree).
        #[derive(Deserialize)]
        struct Recorded {
            start: Option<StartPath>,
        }
        result.read::<Recorded>()?.start
    }

    /// A command's path from its result: `warm` when a prepared sandbox ran it.
    pub fn of_run(result: &airlock::RunResult) -> StartPath {
        match result.details.iter().any(|d| d == WARM_DETAIL) {
            true => StartPath::Warm,
            false => StartPath::Cold,
        }
    }

    /// A command's result as its record keeps it: the library's, with this path as `start`,
    /// written once.
    pub fn record(self, result: &airlock::RunResult) -> Option<Document> {
        #[derive(Serialize)]
        struct Recorded<'r> {
            #[serde(flatten)]
            result: &'r airlock::RunResult,
            start: StartPath,
        }
        Document::of(&Recorded {
            result,
            start: self,
        })
        .ok()
    }
}

/// The start path a run's ending records, if it started.
pub fn start_of(ending: &Ending) -> Option<StartPath> {
    ending.result.as_ref().and_then(StartPath::of_result)
}
