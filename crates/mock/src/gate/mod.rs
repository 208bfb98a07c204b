//! The door of the Files and Batches APIs, one file per wire: auth, mode,
//! version headers, the rate bucket and the error and event shapes every
//! file and batch route of that provider answers with (`openai` for
//! OpenAI/Azure, `anthropic` for Message Batches, `gemini` for Gemini's
//! files and batches).

pub(crate) mod anthropic;
pub(crate) mod gemini;
pub(crate) mod openai;
