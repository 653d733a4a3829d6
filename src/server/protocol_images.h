// Private to src/server/protocol*.cpp: the image parts of chat messages and /generate's image_data.
#pragma once

#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "server/protocol.h"

namespace kiln::server {

// A chat message's content for the template, collecting its images in order. Text-only content (a string, or
// text parts) becomes the joined text, as before; with image parts (`{"type": "image_url", "image_url":
// {"url":
// ...}}`, the url also accepted as a bare string) the list of parts is kept for the template (Qwen3-VL's
// renders each image as <|vision_start|><|image_pad|><|vision_end|>). Throws ApiError: other part types, a
// malformed part, or any image when lim.vision is null (a text-only model).
nlohmann::json chat_content(const nlohmann::json& content, size_t message, const ApiLimits& lim,
                            std::vector<ImageRef>& images);

// /generate's image_data: absent/null -> none; a string or a list of strings (data: URL, http(s) URL or raw
// base64). Throws ApiError for other shapes, or for any image when lim.vision is null.
std::vector<ImageRef> generate_image_refs(const nlohmann::json& body, const ApiLimits& lim);

// Loads the images and expands the prompt's pads (server/images.h): the prompt must hold one
// <|vision_start|><|image_pad|><|vision_end|> per image (400 naming both counts otherwise, before anything is
// fetched). No-op without images.
void attach_images(GenSpec& g, const std::vector<ImageRef>& images, const ApiLimits& lim, const char* param);

}  // namespace kiln::server
