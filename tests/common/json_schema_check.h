// Test helper: an independent validator for the JSON Schema subset that infer/json_schema.h
// compiles (type, properties, required, additionalProperties, items, minItems, maxItems, enum,
// const, anyOf, oneOf, local $ref), written from the JSON Schema semantics rather than from the
// automaton, so the constrained outputs are checked against the schema, not against themselves.
#pragma once
#include <nlohmann/json.hpp>
#include <string>

namespace k3::test {

// "" when `v` validates against `schema` (`root`: the document $ref resolves in), else why.
std::string schema_violation(const nlohmann::json& v, const nlohmann::json& schema, const nlohmann::json& root);

}  // namespace k3::test
