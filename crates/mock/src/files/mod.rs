//! The Files APIs: `openai` (`/v1/files…`, Azure's `/openai/files…`) and
//! `gemini` (`/upload/v1beta/files`, `/v1beta/files/…`,
//! `/download/v1beta/files/…`). Their stores live in `state`, their gates in
//! `gate`; the batch routes read and write the same files.

pub(crate) mod gemini;
pub(crate) mod openai;
