//! placeholder: OpenAI and Azure Batch API
