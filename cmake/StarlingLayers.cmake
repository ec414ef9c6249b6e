# The libraries in layers, lowest first. A library may link only libraries of lower layers, so the
# dependency direction README.md draws holds by construction: configuring fails, naming both, when
# a library links one of its own layer or above, and when a starling_* library is in no layer.
set(STARLING_LAYERS
    "starling_common starling_openblas starling_proto"
    "starling_model_layout starling_kernels_cuda starling_partners"
    "starling_codec starling_kernels_nccl starling_membership"
    "starling_kernels starling_peer"
    "starling_model starling_data"
    "starling_optimizer"
    "starling_engine"
    "starling_daemon starling_experiment starling_sim"
    "starling_swarm"
    "starling_service starling_cli")

# What `target` links itself, privately or for its users.
function(starling_direct_links target out)
    set(links)
    foreach(property LINK_LIBRARIES INTERFACE_LINK_LIBRARIES)
        get_target_property(found ${target} ${property})
        if(found)
            list(APPEND links ${found})
        endif()
    endforeach()
    set(${out} ${links} PARENT_SCOPE)
endfunction()

# Sets layer_of_<library> to each library's layer index, in the caller's scope.
macro(starling_layer_indices)
    set(index 0)
    foreach(layer IN LISTS STARLING_LAYERS)
        separate_arguments(members UNIX_COMMAND "${layer}")
        foreach(member IN LISTS members)
            set(layer_of_${member} ${index})
        endforeach()
        math(EXPR index "${index} + 1")
    endforeach()
endmacro()

# Checks the libraries defined in the given source directories.
function(starling_check_layers)
    starling_layer_indices()
    foreach(directory IN LISTS ARGN)
        get_property(targets DIRECTORY ${directory} PROPERTY BUILDSYSTEM_TARGETS)
        foreach(target IN LISTS targets)
            get_target_property(type ${target} TYPE)
            if(NOT target MATCHES "^starling_" OR NOT type MATCHES "LIBRARY$")
                continue()
            endif()
            if(NOT DEFINED layer_of_${target})
                message(FATAL_ERROR "library ${target} is in no layer: add it to STARLING_LAYERS "
                                    "(cmake/StarlingLayers.cmake) where its dependencies put it")
            endif()
            starling_direct_links(${target} links)
            foreach(link IN LISTS links)
                if(DEFINED layer_of_${link} AND NOT layer_of_${link} LESS layer_of_${target})
                    message(FATAL_ERROR "${target} links ${link}, which is not below it "
                                        "(cmake/StarlingLayers.cmake, README.md's layout)")
                endif()
            endforeach()
        endforeach()
    endforeach()
endfunction()

# The libraries a node needs to talk to its peers stay free of the compute stack: the codecs and
# the peer layer link neither BLAS nor CUDA, directly or through anything they link.
set(STARLING_NO_COMPUTE starling_codec starling_peer)
set(STARLING_COMPUTE starling_kernels starling_kernels_cuda starling_kernels_nccl starling_openblas
                     CUDA::cudart CUDA::cublas)

# The names of everything `target` links, through targets it links, to any depth.
function(starling_link_closure target out)
    set(seen)
    set(pending ${target})
    while(pending)
        list(POP_FRONT pending current)
        if(current IN_LIST seen OR NOT TARGET ${current})
            continue()
        endif()
        list(APPEND seen ${current})
        starling_direct_links(${current} links)
        list(APPEND pending ${links})
    endwhile()
    set(${out} ${seen} PARENT_SCOPE)
endfunction()

function(starling_check_no_compute)
    foreach(library IN LISTS STARLING_NO_COMPUTE)
        starling_link_closure(${library} closure)
        foreach(compute IN LISTS STARLING_COMPUTE)
            if(compute IN_LIST closure)
                message(FATAL_ERROR "${library} links ${compute} (through its dependencies): the "
                                    "codecs and the peer layer must not link BLAS or CUDA "
                                    "(cmake/StarlingLayers.cmake)")
            endif()
        endforeach()
    endforeach()
endfunction()

# The CUDA and NCCL backends implement the interfaces of kernels/ (ops.h, all_reduce.h) and share
# its per-element math.h, while starling_kernels links them to make a backend: one family, whose
# members include each other's headers freely.
set(STARLING_LAYER_FAMILIES "starling_kernels starling_kernels_cuda starling_kernels_nccl")

# Headers cross layers too: a source or header of a library may include a project header only if
# the library that owns it is the same, of its family, or in a lower layer. A header belongs to the
# library that compiles the source of the same name beside it; otherwise to the lowest-layer
# library with sources in its directory or the nearest directory above. Configuring fails naming
# the file, the header and both libraries.
function(starling_check_include_layers)
    starling_layer_indices()
    foreach(family IN LISTS STARLING_LAYER_FAMILIES)
        separate_arguments(members UNIX_COMMAND "${family}")
        foreach(member IN LISTS members)
            set(family_of_${member} "${family}")
        endforeach()
    endforeach()
    set(libraries)
    foreach(directory IN LISTS ARGN)
        get_property(targets DIRECTORY ${directory} PROPERTY BUILDSYSTEM_TARGETS)
        foreach(target IN LISTS targets)
            get_target_property(type ${target} TYPE)
            if(target MATCHES "^starling_" AND type MATCHES "LIBRARY$" AND NOT type STREQUAL
                                                                           "INTERFACE_LIBRARY")
                list(APPEND libraries ${target})
            endif()
        endforeach()
    endforeach()
    # Owners by source stem and by directory (the lowest layer wins a shared directory).
    set(directories)
    foreach(target IN LISTS libraries)
        get_target_property(sources ${target} SOURCES)
        set(own_sources_${target})
        foreach(source IN LISTS sources)
            get_filename_component(source "${source}" ABSOLUTE BASE_DIR "${PROJECT_SOURCE_DIR}")
            if(NOT source MATCHES "^${PROJECT_SOURCE_DIR}/" OR NOT EXISTS "${source}")
                continue()  # generated (the emulated kernels' wrappers, protobuf)
            endif()
            list(APPEND own_sources_${target} "${source}")
            get_filename_component(stem "${source}" NAME_WLE)
            get_filename_component(dir "${source}" DIRECTORY)
            set("owner_of_${dir}/${stem}" ${target})
            if(NOT DEFINED "dir_owner_${dir}" OR layer_of_${target} LESS layer_of_${dir_owner_${dir}})
                set("dir_owner_${dir}" ${target})
            endif()
            list(APPEND directories "${dir}")
        endforeach()
    endforeach()
    list(REMOVE_DUPLICATES directories)
    # The owner of a project file: by stem, else by its directory or the nearest one above.
    macro(starling_owner_of file out)
        get_filename_component(_dir "${file}" DIRECTORY)
        get_filename_component(_stem "${file}" NAME_WLE)
        set(${out})
        if(DEFINED "owner_of_${_dir}/${_stem}")
            set(${out} ${owner_of_${_dir}/${_stem}})
        else()
            while(_dir MATCHES "^${PROJECT_SOURCE_DIR}/")
                if(DEFINED "dir_owner_${_dir}")
                    set(${out} ${dir_owner_${_dir}})
                    break()
                endif()
                get_filename_component(_dir "${_dir}" DIRECTORY)
            endwhile()
        endif()
    endmacro()
    # Each library's files: its sources and the headers it owns.
    foreach(directory IN LISTS directories)
        file(GLOB headers "${directory}/*.h" "${directory}/*.cuh")
        foreach(header IN LISTS headers)
            starling_owner_of("${header}" owner)
            if(owner)
                list(APPEND own_sources_${owner} "${header}")
            endif()
        endforeach()
    endforeach()
    foreach(target IN LISTS libraries)
        foreach(file IN LISTS own_sources_${target})
            file(STRINGS "${file}" includes REGEX "^#include \"[^\"]+\"")
            foreach(line IN LISTS includes)
                string(REGEX REPLACE "^#include \"([^\"]+)\".*" "\\1" included "${line}")
                set(path "${PROJECT_SOURCE_DIR}/${included}")
                if(NOT EXISTS "${path}")
                    continue()  # generated, or not a path from the root
                endif()
                starling_owner_of("${path}" owner)
                if(NOT owner OR owner STREQUAL target)
                    continue()
                endif()
                if(DEFINED family_of_${target} AND "${family_of_${target}}" STREQUAL
                                                   "${family_of_${owner}}")
                    continue()
                endif()
                if(NOT layer_of_${owner} LESS layer_of_${target})
                    file(RELATIVE_PATH shown "${PROJECT_SOURCE_DIR}" "${file}")
                    message(FATAL_ERROR "${shown} (${target}) includes ${included}, which "
                                        "belongs to ${owner}, not below it "
                                        "(cmake/StarlingLayers.cmake, README.md's layout)")
                endif()
            endforeach()
        endforeach()
    endforeach()
endfunction()
