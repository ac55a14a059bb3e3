// Grammars for infer/json_grammar.h: plain JSON (any value, or an object at the top: OpenAI's
// response_format json_object) and a practical subset of JSON Schema (response_format
// json_schema), compiled into the automaton so that every completed value validates.
//
// Supported keywords:
//  - type: object, array, string, number, integer, boolean, null, or an array of them
//    (integer means digits only: no fraction or exponent). Without type, the keywords present
//    decide (properties/required/additionalProperties: object; items/minItems/maxItems: array);
//    with none, any value.
//  - properties, required, additionalProperties. With properties, only the declared keys are
//    emitted, in declaration order; required ones must appear, optional ones may be skipped
//    (so the object cannot close before its required keys). Extra keys are never emitted,
//    whatever additionalProperties says (the value still validates). Without properties:
//    additionalProperties false allows only {}, a schema constrains every value, true or
//    absent allows any. Every name in required must be declared in properties.
//  - items (one schema), minItems, maxItems.
//  - enum, const: the values, emitted as their compact JSON text (alongside type: the values
//    of that type).
//  - anyOf / oneOf whose branches start with distinct characters (e.g. a string or null, an
//    object or an array; branches that could both start with the same byte are an error).
//  - $ref to "#", "#/$defs/<name>" or "#/definitions/<name>" (recursion allowed).
//  - annotations, ignored: title, description, default, examples, $schema, $id, $comment,
//    deprecated, readOnly, writeOnly, $defs, definitions.
// Any other keyword (pattern, format, minLength, minimum, allOf, prefixItems, ...) is a
// k3::Error naming the keyword and where it is ("response_format schema: /properties/a:
// unsupported keyword 'pattern'"), never ignored. So is a schema no value can satisfy within
// the depth limit (e.g. a required property that recurses into itself).
#pragma once
#include <memory>
#include <string_view>

#include <nlohmann/json.hpp>

#include "infer/json_grammar.h"

namespace k3 {

std::shared_ptr<const JsonGrammar> json_any_grammar(const JsonLimits& limits = {});     // any value
std::shared_ptr<const JsonGrammar> json_object_grammar(const JsonLimits& limits = {});  // an object

// `schema` keeps its keys in document order (properties are emitted in that order).
std::shared_ptr<const JsonGrammar> compile_json_schema(const nlohmann::ordered_json& schema,
                                                       const JsonLimits& limits = {});
// The same from JSON text (parse errors are a k3::Error).
std::shared_ptr<const JsonGrammar> compile_json_schema_text(std::string_view schema_text,
                                                            const JsonLimits& limits = {});

}  // namespace k3
